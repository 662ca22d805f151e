# device_env.sh (sourced): paths on a GPU machine that runs binaries built
# elsewhere (tests/gpu/carry_libs.sh): .devlibs.tgz unpacked (its libraries and
# Open MPI into /tmp, megatrain and the GPU test programs into build/cuda), its
# libraries first, then the CUDA toolkit's and NCCL wherever the machine has
# it; and the carried Open MPI's mpirun, the one that matches the carried
# libmpi (/tmp/devmpi, relocated with OPAL_PREFIX).
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ -f "$repo/.devlibs.tgz" ]]; then
  tar xzf "$repo/.devlibs.tgz" -C /tmp devlibs devmpi
  tar xzf "$repo/.devlibs.tgz" -C "$repo" build/cuda 2>/dev/null || true  # the programs (an older one has none)
fi
nccl=$(find /usr/local/cuda*/lib* /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -name 'libnccl.so.2' 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="/tmp/devlibs:/usr/local/cuda/lib64:${nccl:+$(dirname "$nccl"):}${LD_LIBRARY_PATH:-}"
export MEGATRAIN="$repo/build/cuda/megatrain"
if [[ -f "$repo/.devlibs.tgz" && -x /tmp/devmpi/bin/mpirun ]]; then  # the launcher that matches the carried libmpi
  arch_dir=$(dirname "$(find /tmp/devmpi/lib -maxdepth 2 -name openmpi -type d | head -n 1)")
  export OPAL_PREFIX=/tmp/devmpi PATH="/tmp/devmpi/bin:$PATH"
  export PMIX_MCA_mca_base_component_path="$arch_dir/pmix2/lib/pmix"
  export LD_LIBRARY_PATH="$arch_dir/pmix2/lib:$arch_dir/openmpi/lib:$LD_LIBRARY_PATH"
fi
