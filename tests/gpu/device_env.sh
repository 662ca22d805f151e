# device_env.sh (sourced): library paths on a GPU machine that runs binaries
# built elsewhere (tests/gpu/carry_libs.sh): the carried .devlibs first, then
# the CUDA toolkit's libraries and NCCL wherever the machine has it.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
nccl=$(find /usr/local/cuda*/lib* /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -name 'libnccl.so.2' 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="$repo/.devlibs:/usr/local/cuda/lib64:${nccl:+$(dirname "$nccl"):}${LD_LIBRARY_PATH:-}"
export MEGATRAIN="$repo/build/cuda/megatrain"
