#pragma once
// Keep PyTorch's notion of "the accelerator" what it was before the unified
// device was registered.
//
// PyTorch (2.8 and newer) answers at::getAccelerator() with PrivateUse1 as soon
// as that backend has a name. The autograd engine picks node streams only for
// the accelerator's device type, so from then on every CUDA backward fails an
// internal assertion (opt_ready_stream && opt_parent_stream), and
// torch.accelerator, pin_memory() and torch.Stream() all talk to the unified
// device. Unified memory is host memory served to CUDA, not an accelerator: the
// extension rebinds the dynamic-linker slots through which libtorch calls
// at::accelerator::getAccelerator() to a function that gives the previous
// answer, and the slots of at::accelerator::isAccelerator() to one that says
// no for PrivateUse1 (the engine would sync unified gradients through the
// accelerator's streams and events, which unified memory has not). The fork has no such problem: there, unified is a device type of its
// own and never an accelerator.

#include <c10/core/DeviceType.h>

#include <optional>

namespace at::native::unified {

// Install the hook; `previous` is what getAccelerator() returned before the
// rename (std::nullopt: no accelerator). Returns how many call slots were
// rebound (0: the hook could not be installed; callers fall back).
int install_accelerator_hook(std::optional<c10::DeviceType> previous);

} // namespace at::native::unified
