// optgym's pass plugin: which functions of a module stay in its object whatever the inliner does.
//
// Loaded into an unmodified clang with its own option, -fpass-plugin=<this library>. At the start of the
// optimization pipeline, before any pass has run, it writes the names of the module's external function
// definitions, and of the functions whose address is taken (a vtable's slot, a stored callback), to the file
// named by $OPTGYM_SURVIVING_OUT, each followed by a NUL byte, and changes nothing.
// The inliner runs later in the same pipeline, so the file is whole before the interactive channel asks its
// first question. Without the variable it writes nothing. See optgym/toolchain/pass_plugin.py for why.
#include "llvm/IR/Module.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Plugins/PassPlugin.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct WriteSurvivingFunctions : llvm::PassInfoMixin<WriteSurvivingFunctions> {
  llvm::PreservedAnalyses run(llvm::Module &module, llvm::ModuleAnalysisManager &) {
    const char *path = std::getenv("OPTGYM_SURVIVING_OUT");
    if (path == nullptr)
      return llvm::PreservedAnalyses::all();
    std::string names;
    for (const llvm::Function &function : module)
      // an address kept in a vtable or a variable keeps the body whatever the inliner does with its calls
      if (!function.isDeclaration() && (function.hasExternalLinkage() || function.hasAddressTaken())) {
        names += function.getName();
        names += '\0';
      }
    std::string partial = std::string(path) + ".partial";  // renamed into place: a reader never sees half of it
    if (std::FILE *file = std::fopen(partial.c_str(), "wb")) {
      bool written = std::fwrite(names.data(), 1, names.size(), file) == names.size();
      if (std::fclose(file) == 0 && written)
        std::rename(partial.c_str(), path);
    }
    return llvm::PreservedAnalyses::all();
  }
  static bool isRequired() { return true; }  // also where a function is optnone
};

}  // namespace

extern "C" LLVM_ATTRIBUTE_WEAK llvm::PassPluginLibraryInfo llvmGetPassPluginInfo() {
  return {LLVM_PLUGIN_API_VERSION, "optgym-surviving-functions", "1", [](llvm::PassBuilder &builder) {
            builder.registerPipelineStartEPCallback(
                [](llvm::ModulePassManager &passes, llvm::OptimizationLevel) {
                  passes.addPass(WriteSurvivingFunctions());
                });
          }};
}
