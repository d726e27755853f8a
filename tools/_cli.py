"""What the probes in tools/ share: writing their JSON record, and running as a command with
bad input reported as one line and exit status 2 (as ``python -m torch_direct`` does)."""
import json
import sys
from pathlib import Path


def write_record(path, record: dict) -> None:
    """Write ``record`` as JSON to ``path`` (its directory made first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def run(name: str, main) -> None:
    """``main()``, with ValueError / RuntimeError / FileNotFoundError as ``name: error: ...``, exit 2."""
    try:
        main()
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(2)
