#include "AcceleratorHook.h"

#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>

#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace at::native::unified {
namespace {

std::optional<c10::DeviceType> g_previous;

std::optional<c10::DeviceType> previous_accelerator(bool checked) {
  if (checked) {
    TORCH_CHECK(g_previous.has_value(),
                "Cannot access accelerator device when none is available.");
  }
  return g_previous;
}

// at::accelerator::isAccelerator as libtorch defined it, for every other type.
bool (*g_is_accelerator)(c10::DeviceType) = nullptr;

bool is_accelerator_but_unified(c10::DeviceType type) {
  if (type == c10::DeviceType::PrivateUse1) {
    return false;
  }
  return g_is_accelerator != nullptr && g_is_accelerator(type);
}

constexpr const char* kGetAccelerator = "_ZN2at11accelerator14getAcceleratorEb";
constexpr const char* kIsAccelerator = "_ZN2at11accelerator13isAcceleratorEN3c1010DeviceTypeE";

struct Search {
  const char* symbol;
  void* replacement;
  int patched;
};

bool write_slot(uintptr_t slot, void* value) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* start = reinterpret_cast<void*>(slot & ~(page - 1));
  // The slot may sit in a read-only (RELRO) page: open it for this write.
  if (mprotect(start, page, PROT_READ | PROT_WRITE) != 0) {
    return false;
  }
  *reinterpret_cast<void**>(slot) = value;
  mprotect(start, page, PROT_READ);
  return true;
}

int visit(struct dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<Search*>(data);
  const char* name = info->dlpi_name;
  if (name == nullptr || std::strstr(name, "libtorch") == nullptr) {
    return 0;
  }
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    }
  }
  if (dyn == nullptr) {
    return 0;
  }
  // glibc stores these addresses already relocated; be tolerant of loaders
  // that keep them as offsets.
  auto at = [&](ElfW(Addr) p) { return p < info->dlpi_addr ? p + info->dlpi_addr : p; };
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela)* tables[2] = {nullptr, nullptr};
  size_t sizes[2] = {0, 0};
  for (; dyn->d_tag != DT_NULL; ++dyn) {
    switch (dyn->d_tag) {
      case DT_SYMTAB: symtab = reinterpret_cast<const ElfW(Sym)*>(at(dyn->d_un.d_ptr)); break;
      case DT_STRTAB: strtab = reinterpret_cast<const char*>(at(dyn->d_un.d_ptr)); break;
      case DT_JMPREL: tables[0] = reinterpret_cast<const ElfW(Rela)*>(at(dyn->d_un.d_ptr)); break;
      case DT_PLTRELSZ: sizes[0] = dyn->d_un.d_val; break;
      case DT_RELA: tables[1] = reinterpret_cast<const ElfW(Rela)*>(at(dyn->d_un.d_ptr)); break;
      case DT_RELASZ: sizes[1] = dyn->d_un.d_val; break;
      default: break;
    }
  }
  if (symtab == nullptr || strtab == nullptr) {
    return 0;
  }
  for (int t = 0; t < 2; ++t) {
    if (tables[t] == nullptr) {
      continue;
    }
    const size_t count = sizes[t] / sizeof(ElfW(Rela));
    for (size_t i = 0; i < count; ++i) {
      const ElfW(Rela)& r = tables[t][i];
      const auto type = ELF64_R_TYPE(r.r_info);
      if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) {
        continue;
      }
      const ElfW(Sym)& sym = symtab[ELF64_R_SYM(r.r_info)];
      if (std::strcmp(strtab + sym.st_name, search->symbol) != 0) {
        continue;
      }
      if (write_slot(info->dlpi_addr + r.r_offset, search->replacement)) {
        search->patched += 1;
      }
    }
  }
  return 0;
}

} // namespace

int install_accelerator_hook(std::optional<c10::DeviceType> previous) {
#if defined(__x86_64__)
  g_previous = previous;
  Search search{kGetAccelerator, reinterpret_cast<void*>(&previous_accelerator), 0};
  dl_iterate_phdr(&visit, &search);
  // The engine also asks whether a gradient's device is an accelerator, to
  // sync it through that device's streams and events; unified memory has
  // neither, so its gradients take the path of CPU ones.
  // (This library's own slot for it is not rebound: it names the original.)
  g_is_accelerator = &at::accelerator::isAccelerator;
  Search is{kIsAccelerator, reinterpret_cast<void*>(&is_accelerator_but_unified), 0};
  dl_iterate_phdr(&visit, &is);
  return search.patched;
#else
  (void)previous;
  return 0;
#endif
}

} // namespace at::native::unified
