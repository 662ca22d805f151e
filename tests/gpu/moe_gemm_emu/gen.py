# gen.py: kernels/moe_gemm.cu -> the host C++ that tests/gpu/moe_gemm_emu/emu.cpp includes: the PTX
# primitives (between the "PTX primitives" markers), the extern shared memory and the launch replaced by the
# emulator's. Usage: python3 gen.py kernels/moe_gemm.cu OUT.inc [--library]: with --library the launchers become
# extern "C" emu_moe_gemm_* (fake_cuda.c's cuda_moe_gemm_* call them).
import re
import sys
src = open(sys.argv[1]).read()
a = src.index('// ---- PTX primitives')
b = src.index('// ---- end of PTX primitives ----')
src = src[:a] + '// (PTX primitives: the emulator\'s)\n' + src[b:]
src = src.replace('#include "../src/backend/cuda/cuda_kernels.h"\n', '')
src = src.replace('#include "bf16.cuh"\n', '')
old = 'extern __shared__ __align__(128) unsigned char smem_raw[];'
assert old in src
src = src.replace(old, 'unsigned char *smem_raw = emu_smem();')
m = re.search(r'template <int MODE>\ncudaError_t launch\(.*?\n}\n', src, re.S)
assert m
src = src[:m.start()] + '''template <int MODE>
cudaError_t launch(const Args &p, long blocks, cudaStream_t stream) {
    if (blocks <= 0) return cudaSuccess;
    if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
    emu_launch(moe_gemm_kernel<MODE>, blocks, p, (size_t)kSmemBytes);
    return cudaSuccess;
}
''' + src[m.end():]
if '--library' in sys.argv[3:]:
    src = re.sub(r'^cudaError_t cuda_moe_gemm_', 'extern "C" cudaError_t emu_moe_gemm_', src, flags=re.M)
open(sys.argv[2], 'w').write(src)
