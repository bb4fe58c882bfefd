// Link stand-ins for host functions of upstream Proteus's runtime library (libproteus) that
// some upstream GPU test programs call. Built without Proteus, those programs would not link;
// each function here only steers Proteus itself, so doing nothing leaves the programs' own
// output unchanged. Kernel code gets no stand-ins: a program that needs one is excluded
// (programs.json says why). The declarations come from upstream's own header, so a change of
// signature upstream breaks this build instead of going unnoticed.
#include <proteus/Init.h>

namespace proteus {

// enable_disable.cpp: switch Proteus's JIT off and on again between launches of one kernel.
// Natively every launch runs the compiled kernel, which is what the program prints either way.
void enable() {}
void disable() {}

// kernel_pass_plugin.cpp: add an LLVM pass plugin to Proteus's JIT pipeline. The plugin only
// prints a trace line of its own; the program's output does not depend on it.
void registerJITPassPlugin(const std::string &, const std::string &) {}

} // namespace proteus
