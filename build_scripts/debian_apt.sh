# Sourced by fetch_source and debian_deps: a private apt configuration that
# reads one Debian suite's source index from this machine's own mirror, so
# the system's apt setup is never touched.

# The first Debian archive URI of this machine's apt sources (deb822 or
# one-line format, comments skipped), leaving out the security archive.
mirror_from_apt() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(grep -Eo '(URIs:[[:space:]]*|^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)(https?://[^[:space:]]+)' "$f" 2>/dev/null \
          | grep -Eo 'https?://[^[:space:]]+' | grep -v -- '-security' | grep '/debian' | head -n 1 || true)
    if [ -n "$uri" ]; then echo "$uri"; return 0; fi
  done
  return 1
}

# sha256_ok FILE SHA256: FILE exists and has that digest.
sha256_ok() {
  [ -f "$1" ] && echo "$2  $1" | sha256sum -c --quiet - >/dev/null 2>&1
}

# private_apt DIR SUITE: write DIR's deb-src entry for SUITE, fetch its index
# (once), and set the array APT_OPTS for apt-get.
private_apt() {
  local dir="$1" suite="$2" mirror
  mirror=$(mirror_from_apt) || { echo "no Debian mirror in this machine's apt sources" >&2; return 1; }
  mkdir -p "$dir/lists/partial" "$dir/sources.list.d"
  cat > "$dir/sources.list.d/src.sources" <<SRC
Types: deb-src
URIs: $mirror
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  APT_OPTS=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$dir/sources.list.d"
            -o "Dir::State::Lists=$dir/lists" -o "APT::Sandbox::User=root")
  if ! ls "$dir/lists" | grep -q "_${suite}_main_source_Sources"; then
    apt-get "${APT_OPTS[@]}" update -qq
  fi
}
