# Makefile: builds build/megatrain (CPU backend always; CUDA parts with CUDA=1)
# and the tests. `make test` runs every CI test; `make help` lists targets.

CC       ?= gcc
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
# OpenBLAS built for OpenMP shares our OpenMP thread pool; the pthread build's
# own pool fights it for the cores (4x slower on 2 cores). Prefer the former.
# Debian's multiarch directories: x86_64-linux-gnu, aarch64-linux-gnu (Grace Hopper).
HOST_ARCH := $(shell uname -m)
BLAS_OMP_DIR := /usr/lib/$(HOST_ARCH)-linux-gnu/openblas-openmp
ifneq ($(wildcard $(BLAS_OMP_DIR)/libopenblas.so),)
  BLAS_CFLAGS ?= -I/usr/include/$(HOST_ARCH)-linux-gnu/openblas-openmp
  BLAS_LIBS   ?= -L$(BLAS_OMP_DIR) -Wl,-rpath,$(BLAS_OMP_DIR) -lopenblas
else
  BLAS_CFLAGS ?= $(shell pkg-config --cflags openblas 2>/dev/null)
  BLAS_LIBS   ?= $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
endif

# PCRE2 (the pre-tokenizer regexes) and utf8proc (Unicode normalization) for
# src/tokenize; -DPCRE2_CODE_UNIT_WIDTH is set in the one file that includes pcre2.h.
TOKENIZE_CFLAGS := $(shell pkg-config --cflags libpcre2-8 libutf8proc 2>/dev/null)
TOKENIZE_LIBS   := $(shell pkg-config --libs libpcre2-8 libutf8proc 2>/dev/null || echo -lpcre2-8 -lutf8proc)

# x86-64-v2 (SSE4.2, POPCNT: every x86-64 CPU since 2009); other architectures (aarch64) their baseline.
MARCH    := $(if $(filter x86_64,$(HOST_ARCH)),-march=x86-64-v2)
OPT      ?= -O2 $(MARCH)
CFLAGS   += -std=c11 -D_GNU_SOURCE -Isrc -Wall -Wextra -Wno-unused-parameter $(OPT) -g -fopenmp \
            $(MPI_CFLAGS) $(BLAS_CFLAGS) $(TOKENIZE_CFLAGS) -MMD -MP
LDLIBS   += $(BLAS_LIBS) $(MPI_LIBS) -lyaml -lzstd $(TOKENIZE_LIBS) -lm -fopenmp -lpthread

# BUILD holds the programs; the objects live in one directory per
# configuration (OBJDIR: build/obj/cpu or build/obj/cuda), shared by every
# BUILD, so `make`, `make CUDA=1`, `make test` and `make test-gpu` can follow
# each other in one tree: none reuses the other's objects, and a program is
# linked again when the configuration it was linked from changes (the
# .link-config stamp beside it) or its objects' flags change (.flags).
BUILD    ?= build
ifeq ($(EMU),1)
  CUDA := 1
endif
CONFIG   := $(if $(filter 1,$(EMU)),emu,$(if $(filter 1,$(CUDA)),cuda,cpu))
OBJDIR   ?= build/obj/$(CONFIG)
SRC      := $(shell find src -name '*.c' -not -path 'src/backend/cuda/*' -not -path 'src/model/cuda/*' | sort)
LIB_SRC  := $(filter-out src/main.c,$(SRC))
OBJ      := $(SRC:%.c=$(OBJDIR)/%.o)
LIB_OBJ  := $(LIB_SRC:%.c=$(OBJDIR)/%.o)

# CUDA=1: kernels/*.cu (nvcc), src/backend/cuda/*.c (device context, cuBLASLt, kernel launchers) and
# src/model/cuda/*.c (the CUDA model) join the binary.
ifeq ($(CUDA),1)
  CUDA_HOME ?= /usr/local/cuda
  NVCC      ?= $(CUDA_HOME)/bin/nvcc
  CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80
  NVCCFLAGS += -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fPIC -MMD -MP
  CU_SRC    := $(sort $(wildcard kernels/*.cu))
  CUDA_C    := $(sort $(wildcard src/backend/cuda/*.c src/model/cuda/*.c))
  CU_OBJ    := $(CU_SRC:%.cu=$(OBJDIR)/%.o) $(CUDA_C:%.c=$(OBJDIR)/%.o)
  CFLAGS    += -DMT_CUDA -I$(CUDA_HOME)/include
ifeq ($(EMU),1)
  # EMU=1 (with CUDA=1 implied): the same CUDA build run on the CPU (tests/gpu/emu/README.md): each .cu
  # rewritten by cu2cpp.py and compiled by g++, the CUDA runtime, cuBLAS(Lt) served by emu_runtime.c, NCCL by emu_nccl.c.
  EMU_DIR   := tests/gpu/emu
  CXXFLAGS  := -std=c++17 -O1 -g -fPIC -Wall -Wno-unused-function -Wno-unknown-pragmas -Ikernels \
               -I$(CUDA_HOME)/include -include $(EMU_DIR)/emu_device.h -MMD -MP $(EMU_CXXFLAGS)
  CU_OBJ    += $(OBJDIR)/$(EMU_DIR)/emu_exec.o $(OBJDIR)/$(EMU_DIR)/emu_runtime.o \
               $(OBJDIR)/$(EMU_DIR)/emu_nccl.o $(OBJDIR)/$(EMU_DIR)/emu_streams.o
  LDLIBS    += -lstdc++
else
  LDLIBS    += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lnccl -lstdc++
endif
  LIB_OBJ   += $(CU_OBJ)
  OBJ       += $(CU_OBJ)
endif

UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
# One C++ unit program: fp8.c against the CUDA toolkit's own FP8 conversions (cuda_fp8.hpp, host code: no GPU, no
# nvcc); built to skip (exit 77) where the toolkit's headers are missing.
CUDA_INCLUDE := $(or $(CUDA_HOME),/usr/local/cuda)/include
UNIT_BIN += $(BUILD)/tests/test_fp8_cuda_header

.PHONY: all deps demo test test-build unit-tests bench clean help
all: $(BUILD)/megatrain

# V=1 shows the full command lines.
Q := $(if $(V),,@)

# Stamps rewritten only when their text changes, so that what depends on
# them is rebuilt then and only then (make reads a target's time after its recipe).
STAMP = @mkdir -p $(dir $@); printf '%s\n' '$(1)' | cmp -s - $@ || printf '%s\n' '$(1)' > $@
.PHONY: FORCE
$(OBJDIR)/.flags: FORCE
	$(call STAMP,$(CC) $(CFLAGS) $(NVCC) $(NVCCFLAGS) $(CXXFLAGS) $(EMU_EXEC_FLAGS))
$(BUILD)/.link-config: FORCE
	$(call STAMP,$(OBJDIR) $(LDLIBS))

$(BUILD)/megatrain: $(OBJ) $(BUILD)/.link-config
	@echo "  LINK  $@"
	$(Q)$(CC) -o $@ $(OBJ) $(LDLIBS)

$(OBJDIR)/%.o: %.c $(OBJDIR)/.flags
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

ifeq ($(EMU),1)
.PRECIOUS: $(OBJDIR)/%.cpp
# the kernels' headers rewritten beside the generated .cpp, where #include "x.cuh" finds them first
EMU_CUH := $(patsubst kernels/%.cuh,$(OBJDIR)/kernels/%.cuh,$(wildcard kernels/*.cuh))
$(OBJDIR)/%.cpp: %.cu $(EMU_DIR)/cu2cpp.py | $(EMU_CUH)
	@mkdir -p $(dir $@)
	$(Q)python3 $(EMU_DIR)/cu2cpp.py $< $@
$(OBJDIR)/kernels/%.cuh: kernels/%.cuh $(EMU_DIR)/cu2cpp.py
	@mkdir -p $(dir $@)
	$(Q)python3 $(EMU_DIR)/cu2cpp.py $< $@

$(OBJDIR)/%.o: $(OBJDIR)/%.cpp $(OBJDIR)/.flags
	@echo "  EMU   $*.cu"
	$(Q)g++ $(CXXFLAGS) -c $< -o $@

$(OBJDIR)/$(EMU_DIR)/emu_exec.o: $(EMU_DIR)/emu_exec.cpp $(OBJDIR)/.flags
	@mkdir -p $(dir $@)
	@echo "  CXX   $<"
	$(Q)g++ $(CXXFLAGS) $(EMU_EXEC_FLAGS) -c $< -o $@

# The emulator's checks, each against a kernel that breaks its rule (tests/integration/test_gpu_emu.sh).
$(BUILD)/test_emu_checks: $(OBJDIR)/$(EMU_DIR)/test_emu_checks.o $(LIB_OBJ) $(BUILD)/.link-config
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LIB_OBJ) $(LDLIBS)
else
$(OBJDIR)/%.o: %.cu $(OBJDIR)/.flags
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@
endif

# GCC 12.2 for aarch64 (Debian 12's) stops with an internal compiler error in vect_transform_reduction on loops
# that several unit tests write (a double max or sum over floats): the unit tests are not loop-vectorised there.
UNIT_CFLAGS := $(if $(filter aarch64,$(HOST_ARCH)),-fno-tree-loop-vectorize)
$(BUILD)/tests/%: tests/unit/%.c $(LIB_OBJ) $(BUILD)/.link-config
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	$(Q)$(CC) $(CFLAGS) $(UNIT_CFLAGS) -o $@ $< $(LIB_OBJ) $(LDLIBS) -lcmocka

$(BUILD)/tests/test_fp8_cuda_header: tests/unit/test_fp8_cuda_header.cpp src/core/fp8.h $(OBJDIR)/src/core/fp8.o
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	$(Q)$(CXX) -std=c++17 -O2 -Wall -Wextra -Isrc \
	  $(if $(wildcard $(CUDA_INCLUDE)/cuda_fp8.h),-I$(CUDA_INCLUDE),-DMT_NO_CUDA_FP8) -o $@ $< $(OBJDIR)/src/core/fp8.o -lm

unit-tests: $(UNIT_BIN)

# Installs missing Debian packages (apt-get), then does nothing more.
deps:
	@bash scripts/install_deps.sh

# The README's first command: build, prepare a small data set, train tiny llama.
demo: deps
	@bash scripts/demo.sh

# The README's second command (and CI's): every test, unit and integration.
# Make runs itself again after `deps` so that flags from mpicc/pkg-config exist.
test: deps
	@$(MAKE) --no-print-directory -j2 test-build
	@bash tests/run_tests.sh

test-build: $(BUILD)/megatrain $(UNIT_BIN)

# Every test again against megatrain and the unit programs built with AddressSanitizer,
# LeakSanitizer and UndefinedBehaviorSanitizer (build/sanitize); fails on any report. Not in CI
# (about 20 minutes on 2 cores); run it after changing C code that handles memory.
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
.PHONY: test-sanitize
test-sanitize: deps
	@$(MAKE) --no-print-directory -j2 BUILD=build/sanitize OBJDIR=build/obj/sanitize CC="$(CC) $(SANITIZE_FLAGS)" \
	  CXX="$(CXX) $(SANITIZE_FLAGS)" OPT="-O1 $(MARCH)" test-build
	@$(CC) -shared -fPIC -O1 -o build/sanitize/keep_plugins.so tests/sanitize/keep_plugins.c
	@bash tests/run_sanitize.sh

# Benchmarks need PyTorch (pip install torch); never part of `make test`.
bench: $(BUILD)/megatrain
	bash tests/bench/run_bench.sh

# `megatrain` on the PATH: the docs write `megatrain` for build/megatrain.
PREFIX ?= /usr/local
.PHONY: install
install: $(BUILD)/megatrain
	install -D -m 755 $(BUILD)/megatrain $(DESTDIR)$(PREFIX)/bin/megatrain

clean:
	rm -rf $(BUILD) $(OBJDIR)

help:
	@echo "make            build build/megatrain (CPU backend)"
	@echo "make CUDA=1     also compile and link the CUDA kernels (nvcc, cuBLASLt, NCCL)"
	@echo "make demo       install deps, build, make demo data, train tiny llama on the CPU"
	@echo "make test       install deps, build, run every CI test (unit + integration)"
	@echo "make test-sanitize  every test again under ASan + LSan + UBSan (build/sanitize; ~20 min)"
	@echo "make bench      run the CPU benchmark against PyTorch (needs torch and pyyaml)"
	@echo "make test-gpu   build with CUDA=1 and run the GPU tests (needs a GPU; not part of CI)"
	@echo "make test-gpu-emu  the GPU tests on the CPU emulator, no GPU needed (tests/gpu/emu; ~30 min)"
	@echo "make gpu-emu-asan-build  the emulator under ASan + UBSan (build/emu-asan; tests/integration/test_gpu_emu_asan.sh)"
	@echo "make tsan-build  megatrain under ThreadSanitizer (build/tsan; tests/integration/test_host_threads_tsan.sh)"
	@echo "make gpu-emu-tsan-build  the emulator's racecheck, ThreadSanitizer (build/emu-tsan; tests/integration/test_gpu_emu_racecheck.sh)"
	@echo "make bench-gpu  the GPU benchmark against PyTorch on the same GPU (tests/bench/bench_gpu.py)"
	@echo "make fuzz       fuzz every parser of outside files (libFuzzer; FUZZ_SECONDS=N each, default 60)"
	@echo "make mutants    plant each bug of tests/mutants/mutants.txt and check the tests catch it (MUTANTS=NAME)"
	@echo "make install    copy build/megatrain to \$$PREFIX/bin (PREFIX=/usr/local; DESTDIR too)"
	@echo "make clean      remove build/"
	@echo "V=1             show full compiler command lines"

-include $(shell find $(OBJDIR) $(BUILD)/tests $(BUILD)/gpu-tests -name '*.d' 2>/dev/null)

# GPU tests (not part of CI): every CUDA op and the whole CUDA model against
# the CPU reference, then a tiny recipe trained on both. Needs a GPU and nvcc.
GPU_BUILD := build/cuda
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/test_*.c))
.PHONY: test-gpu gpu-test-build
gpu-test-build:
	@$(MAKE) --no-print-directory -j4 CUDA=1 BUILD=$(GPU_BUILD) $(GPU_BUILD)/megatrain \
	  $(GPU_TEST_SRC:tests/gpu/%.c=$(GPU_BUILD)/gpu-tests/%)

# kernels/attention.cu against an fp64 reference at sizes test_cuda_ops leaves out, then its speed (dense and
# context parallel): tests/gpu/device_check.sh's attention and cp-attention parts (tests/gpu/carry_libs.sh builds
# and carries it: make CUDA=1 BUILD=build/cuda build/cuda/attention_selftest).
$(BUILD)/attention_selftest: tests/gpu/attention_selftest.cu $(OBJDIR)/kernels/attention.o
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	$(Q)$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) -o $@ $< $(OBJDIR)/kernels/attention.o

$(BUILD)/gpu-tests/%: tests/gpu/%.c $(LIB_OBJ) $(BUILD)/.link-config
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	$(Q)$(CC) $(CFLAGS) -Itests/gpu -o $@ $< $(LIB_OBJ) $(LDLIBS) -lcmocka

test-gpu: deps
	@$(MAKE) --no-print-directory gpu-test-build
	@bash tests/gpu/run_gpu_tests.sh

# The same GPU tests with no GPU: the CUDA build on the CPU emulator (tests/gpu/emu/README.md), every kernel run
# on the CPU, the CUDA runtime and cuBLAS(Lt) served by emu_runtime.c, NCCL by emu_nccl.c. tests/integration/
# test_gpu_emu.sh (CI) runs the test programs, test_gpu_emu_nccl.sh the NCCL transport; test-gpu-emu also the
# megatrain runs of tests/gpu/test_*.sh (about 30 minutes), with two emulated GPUs so that the NCCL rows run too.
EMU_BUILD := build/emu
.PHONY: gpu-emu-build test-gpu-emu
gpu-emu-build: $(EMU_BUILD)/test_emu_nccl
	@$(MAKE) --no-print-directory CUDA=1 EMU=1 BUILD=$(EMU_BUILD) $(EMU_BUILD)/megatrain \
	  $(GPU_TEST_SRC:tests/gpu/%.c=$(EMU_BUILD)/gpu-tests/%) $(EMU_BUILD)/test_emu_checks

# The emulator's NCCL on its own, under mpirun (tests/integration/test_gpu_emu_nccl.sh).
EMU_NCCL_SRC := tests/gpu/emu/test_emu_nccl.c tests/gpu/emu/emu_nccl.c tests/gpu/emu/emu_streams.c src/core/float16.c
$(EMU_BUILD)/test_emu_nccl: $(EMU_NCCL_SRC)
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra -O1 -g $(MPI_CFLAGS) -I$(or $(CUDA_HOME),/usr/local/cuda)/include $(EMU_NCCL_SRC) \
	  -o $@ $(MPI_LIBS) -lm

# The emulator's build under AddressSanitizer and UndefinedBehaviorSanitizer (build/emu-asan, objects in
# build/obj/emu-asan): every kernel's global memory access checked to the byte against its cudaMalloc allocation
# (emu_runtime.c pads none), and the CUDA build's host code checked as the CPU build's is by test-sanitize.
# tests/integration/test_gpu_emu_asan.sh (CI) runs the kernel-level GPU test programs there.
EMU_ASAN_BUILD := build/emu-asan
EMU_SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
.PHONY: gpu-emu-asan-build
gpu-emu-asan-build:
	@$(MAKE) --no-print-directory CUDA=1 EMU=1 BUILD=$(EMU_ASAN_BUILD) OBJDIR=build/obj/emu-asan \
	  CC="$(CC) $(EMU_SANITIZE)" EMU_CXXFLAGS="$(EMU_SANITIZE)" $(EMU_ASAN_BUILD)/test_emu_checks \
	  $(patsubst %,$(EMU_ASAN_BUILD)/gpu-tests/%,test_cuda_cublaslt_fp8 test_cuda_ops test_cuda_moe_ops test_cuda_moe_gemm \
	  test_cuda_model test_cuda_parallel_model)

# megatrain under ThreadSanitizer (build/tsan, objects in build/obj/tsan): its own threads, the asynchronous
# checkpoint writer and the data build's workers, checked by tests/integration/test_host_threads_tsan.sh (CI).
.PHONY: tsan-build
tsan-build:
	@$(MAKE) --no-print-directory BUILD=build/tsan OBJDIR=build/obj/tsan CC="$(CC) -fsanitize=thread" build/tsan/megatrain

# The emulator's racecheck build (build/emu-tsan, objects in build/obj/emu-tsan): the kernels and the CUDA build's
# host code under ThreadSanitizer, emu_exec.cpp without it (EMU_TSAN: it tells ThreadSanitizer which CUDA thread runs
# and what orders them), so that two threads of a block that touch the same memory with no barrier between are
# reported whatever order the emulator runs them in. tests/integration/test_gpu_emu_racecheck.sh (CI) runs it.
# GCC's ThreadSanitizer, not clang's: clang's runtime shares 256 slots among the fibres and misses races between
# them (tests/gpu/emu/README.md, "The racecheck").
EMU_TSAN_BUILD := build/emu-tsan
.PHONY: gpu-emu-tsan-build
gpu-emu-tsan-build:
	@$(MAKE) --no-print-directory CUDA=1 EMU=1 BUILD=$(EMU_TSAN_BUILD) OBJDIR=build/obj/emu-tsan \
	  CC="$(CC) -fsanitize=thread" EMU_CXXFLAGS="-fsanitize=thread" EMU_EXEC_FLAGS="-fno-sanitize=thread -DEMU_TSAN" \
	  $(EMU_TSAN_BUILD)/test_emu_checks $(patsubst %,$(EMU_TSAN_BUILD)/gpu-tests/%,test_cuda_cublaslt_fp8 test_cuda_ops \
	  test_cuda_moe_ops test_cuda_moe_gemm test_cuda_model test_cuda_parallel_model)

test-gpu-emu: deps
	@$(MAKE) --no-print-directory gpu-emu-build
	@GPU_BUILD=$(EMU_BUILD) EMU_GPUS=2 MT_GPU_COUNT=2 MT_GPU_TEST_QUICK=1 bash tests/gpu/run_gpu_tests.sh

# The GPU benchmark against PyTorch on the same GPU (needs torch and transformers there).
.PHONY: bench-gpu
bench-gpu:
	@$(MAKE) --no-print-directory CUDA=1 BUILD=$(GPU_BUILD) $(GPU_BUILD)/megatrain
	python3 tests/bench/bench_gpu.py --megatrain $(GPU_BUILD)/megatrain

include tests/fuzz/fuzz.mk
include tests/mutants/mutants.mk
