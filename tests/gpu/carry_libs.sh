#!/usr/bin/env bash
# carry_libs.sh: for a GPU machine that has the CUDA toolkit but not our
# Debian packages (libyaml, zstd, OpenBLAS, OpenMPI): builds build/cuda here
# (make CUDA=1 and the GPU tests) and copies the shared libraries that
# build/cuda/megatrain and the GPU tests need beyond glibc and CUDA's own
# into .devlibs/.
# On the GPU machine: source tests/gpu/device_env.sh, then run the tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory gpu-test-build
rm -rf .devlibs && mkdir -p .devlibs
for bin in build/cuda/megatrain build/cuda/gpu-tests/test_*; do
  [[ "$bin" == *.d ]] || ldd "$bin"
done | awk '/=>/ {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;  # the system's
    libcuda*|libcublas*|libcudart*|libnccl*) ;;                                           # the CUDA install's
    *) cp -L "$lib" .devlibs/ ;;
  esac
done
du -sh .devlibs
