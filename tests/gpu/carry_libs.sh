#!/usr/bin/env bash
# carry_libs.sh: for a GPU machine that has the CUDA toolkit but not our
# Debian packages (libyaml, zstd, OpenBLAS, OpenMPI): builds build/cuda here
# (make CUDA=1 and the GPU tests) and packs into .devlibs.tgz
#   devlibs/  the shared libraries build/cuda/megatrain and the GPU tests need
#             beyond glibc and CUDA's own;
#   devmpi/   this machine's Open MPI runtime (mpirun, its plugins and help
#             files, PMIx): the launcher that matches the carried libmpi.
# Carry .devlibs.tgz and build/cuda there; tests/gpu/device_env.sh unpacks it.
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory gpu-test-build
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/devlibs"
for bin in build/cuda/megatrain build/cuda/gpu-tests/test_*; do
  [[ "$bin" == *.d ]] || ldd "$bin"
done | awk '/=>/ {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;  # the system's
    libcuda*|libcublas*|libcudart*|libnccl*) ;;                                           # the CUDA install's
    *) cp -L "$lib" "$stage/devlibs/" ;;
  esac
done
# Open MPI relocated: the tree under a prefix that OPAL_PREFIX names there (device_env.sh).
arch=$(gcc -print-multiarch)
mkdir -p "$stage/devmpi/bin" "$stage/devmpi/lib/$arch" "$stage/devmpi/share"
cp -L "$(readlink -f "$(command -v mpirun)")" "$stage/devmpi/bin/mpirun"
for d in openmpi pmix2; do [[ -d /usr/lib/$arch/$d ]] && cp -a "/usr/lib/$arch/$d" "$stage/devmpi/lib/$arch/"; done
cp -a /usr/share/openmpi "$stage/devmpi/share/"
tar czf .devlibs.tgz -C "$stage" devlibs devmpi
du -sh .devlibs.tgz
