#!/bin/bash
# Linked-binary sizes of a held-out CMake project built twice at -Oz: plain clang-22, and optgym-cc/optgym-c++
# with the shipped policy (OPTGYM_POLICY unset, OPTGYM_STRICT=1 so a fallback would fail the build), then
# `optgym compare-sizes` on both fields. Per-object sizes over-count template code the linker deduplicates;
# this is the figure a user sees.
#
#   apt-get source uchardet woff2 && bench/heldout_linked.sh woff2-1.0.2 [WORKDIR]
#   OPTGYM_GUARD=1 bench/heldout_linked.sh …  builds the optgym side guarded (clang's object kept where smaller)
#   LTO=thin bench/heldout_linked.sh …        both sides with -flto=thin and lld (LTO=full: -flto=full), the
#                                             optgym side with OPTGYM_SERVE_LTO=1: the policy decides the compile
#                                             steps' inlining, the link's own inliner stays clang's
#   OPTGYM_CANDIDATES=N bench/heldout_linked.sh …  the optgym side compiles each C object N ways (the shipped
#                                             portfolio's first N), the smallest kept
#   CMAKE_ARGS="-DDISABLE_WERROR=ON" bench/…  more configure arguments for both builds (json-c's -Werror)
#   TEST=1 bench/heldout_linked.sh …          then runs the project's ctest suite in both builds: a test that
#                                             fails only in the optgym build is a compiler bug, and exit 1
set -euo pipefail
declare -A result
src=$(realpath "$1"); work=${2:-$PWD}; name=$(basename "$src"); mkdir -p "$work"
lto=${LTO:+-flto=$LTO}; link=${LTO:+-fuse-ld=lld $lto}
bin=$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../.venv/bin
llvm=/usr/lib/llvm-22/bin
for variant in plain optgym; do
  build="$work/build-$name-$variant"
  rm -rf "$build"
  if [ "$variant" = plain ]; then cc=$llvm/clang; cxx=$llvm/clang++; else cc=$bin/optgym-cc; cxx=$bin/optgym-c++; fi
  start=$SECONDS
  (unset OPTGYM_POLICY; export OPTGYM_STRICT=1 OPTGYM_SERVE_LTO=${LTO:+1}
   cmake -S "$src" -B "$build" -G Ninja -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
     -DCMAKE_BUILD_TYPE=MinSizeRel -DCMAKE_C_FLAGS_MINSIZEREL="-Oz -DNDEBUG $lto" -DCMAKE_CXX_FLAGS_MINSIZEREL="-Oz -DNDEBUG $lto" \
     -DCMAKE_EXE_LINKER_FLAGS="$link" -DCMAKE_SHARED_LINKER_FLAGS="$link" -DCMAKE_MODULE_LINKER_FLAGS="$link" \
     -DCMAKE_AR=$llvm/llvm-ar -DCMAKE_RANLIB=$llvm/llvm-ranlib ${CMAKE_ARGS:-} >"$build.log" 2>&1
   cmake --build "$build" -j 2 >>"$build.log" 2>&1) || { echo "$name: the $variant build failed, see $build.log"; exit 1; }
  echo "$name $variant: built in $((SECONDS - start)) s"
done
for field in text code; do
  "$bin/optgym" compare-sizes "$work/build-$name-plain" "$work/build-$name-optgym" --field "$field"
done
if [ -n "${TEST:-}" ]; then
  for variant in plain optgym; do
    if ctest --test-dir "$work/build-$name-$variant" -j 2 >"$work/build-$name-$variant.ctest.log" 2>&1; then
      result[$variant]=passed
    else
      result[$variant]=failed
    fi
    echo "$name $variant: ctest ${result[$variant]}: $(grep -E 'tests passed' "$work/build-$name-$variant.ctest.log")"
  done
  if [ "${result[optgym]}" = failed ] && [ "${result[plain]}" = passed ]; then
    echo "$name: a test fails only in the optgym build: a COMPILER BUG to report (see the .ctest.log files)"; exit 1
  fi
fi
