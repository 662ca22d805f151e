#!/usr/bin/env bash
# carry_libs.sh: for a GPU machine that has the CUDA toolkit but not our
# Debian packages (libyaml, zstd, OpenBLAS, OpenMPI): builds build/cuda here
# (make CUDA=1 and the GPU tests) and packs into .devlibs.tgz
#   devlibs/     the shared libraries build/cuda/megatrain and the GPU tests need
#                beyond glibc and CUDA's own;
#   devmpi/      this machine's Open MPI runtime (mpirun, its plugins and help
#                files, PMIx): the launcher that matches the carried libmpi;
#   build/cuda/  megatrain and the GPU test programs, compressed (a device call
#                carries 64 MiB in all, the working tree included: the eight
#                programs take 36 MB as they are, 15 MB here).
# Carry .devlibs.tgz alone there; tests/gpu/device_env.sh unpacks it (the
# libraries into /tmp, the programs into build/cuda). Ends by checking that the
# working tree and .devlibs.tgz together fit a call, with room to spare.
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory gpu-test-build
make --no-print-directory CUDA=1 BUILD=build/cuda build/cuda/attention_selftest
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/devlibs"
programs=(build/cuda/megatrain build/cuda/attention_selftest)
for t in build/cuda/gpu-tests/test_*; do [[ "$t" == *.d ]] || programs+=("$t"); done
for bin in "${programs[@]}"; do
  ldd "$bin"
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
tar czf .devlibs.tgz -C "$stage" devlibs devmpi -C "$PWD" "${programs[@]}"
# What a call carries: the tracked files, the untracked ones git does not ignore, and .devlibs.tgz.
bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 -r stat -c %s -- 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
bytes=$((bytes + $(stat -c %s .devlibs.tgz)))
mib=$((bytes / 1048576))
echo ".devlibs.tgz $(du -h .devlibs.tgz | cut -f1) (${#programs[@]} programs); a call carries ${mib} MiB of its 64"
if (( mib > 56 )); then
  echo "carry_libs.sh: ${mib} MiB leaves too little of a call's 64 MiB: carry less (or ignore what need not travel)" >&2
  exit 1
fi
