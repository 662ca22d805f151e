# Makefile: builds build/megatrain (CPU backend always; CUDA parts with CUDA=1)
# and the tests. `make test` runs every CI test; `make help` lists targets.

CC       ?= gcc
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
# OpenBLAS built for OpenMP shares our OpenMP thread pool; the pthread build's
# own pool fights it for the cores (4x slower on 2 cores). Prefer the former.
BLAS_OMP_DIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
ifneq ($(wildcard $(BLAS_OMP_DIR)/libopenblas.so),)
  BLAS_CFLAGS ?= -I/usr/include/x86_64-linux-gnu/openblas-openmp
  BLAS_LIBS   ?= -L$(BLAS_OMP_DIR) -Wl,-rpath,$(BLAS_OMP_DIR) -lopenblas
else
  BLAS_CFLAGS ?= $(shell pkg-config --cflags openblas 2>/dev/null)
  BLAS_LIBS   ?= $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
endif

OPT      ?= -O2 -march=x86-64-v2
CFLAGS   += -std=c11 -D_GNU_SOURCE -Isrc -Wall -Wextra -Wno-unused-parameter $(OPT) -g -fopenmp \
            $(MPI_CFLAGS) $(BLAS_CFLAGS) -MMD -MP
LDLIBS   += $(BLAS_LIBS) $(MPI_LIBS) -lyaml -lzstd -lm -fopenmp -lpthread

BUILD    ?= build
SRC      := $(shell find src -name '*.c' -not -path 'src/backend/cuda/*' | sort)
LIB_SRC  := $(filter-out src/main.c,$(SRC))
OBJ      := $(SRC:%.c=$(BUILD)/%.o)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# CUDA=1: kernels/*.cu (nvcc) and src/backend/cuda/*.c (host side) join the binary.
ifeq ($(CUDA),1)
  CUDA_HOME ?= /usr/local/cuda
  NVCC      ?= $(CUDA_HOME)/bin/nvcc
  CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80
  NVCCFLAGS += -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fPIC -MMD -MP
  CU_SRC    := $(sort $(wildcard kernels/*.cu))
  CUDA_C    := $(sort $(wildcard src/backend/cuda/*.c))
  CU_OBJ    := $(CU_SRC:%.cu=$(BUILD)/%.o) $(CUDA_C:%.c=$(BUILD)/%.o)
  CFLAGS    += -DMT_CUDA -I$(CUDA_HOME)/include
  LDLIBS    += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lnccl -lstdc++
  LIB_OBJ   += $(CU_OBJ)
  OBJ       += $(CU_OBJ)
endif

UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all deps demo test test-build unit-tests bench clean help
all: $(BUILD)/megatrain

# V=1 shows the full command lines.
Q := $(if $(V),,@)

$(BUILD)/megatrain: $(OBJ)
	@echo "  LINK  $@"
	$(Q)$(CC) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/tests/%: tests/unit/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(LIB_OBJ) $(LDLIBS) -lcmocka

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

# Benchmarks need PyTorch (pip install torch); never part of `make test`.
bench: $(BUILD)/megatrain
	bash tests/bench/run_bench.sh

clean:
	rm -rf $(BUILD)

help:
	@echo "make            build build/megatrain (CPU backend)"
	@echo "make CUDA=1     also compile and link the CUDA kernels (nvcc, cuBLASLt, NCCL)"
	@echo "make demo       install deps, build, make demo data, train tiny llama on the CPU"
	@echo "make test       install deps, build, run every CI test (unit + integration)"
	@echo "make bench      run the CPU benchmark against PyTorch (needs torch)"
	@echo "make test-gpu   build with CUDA=1 and run the GPU tests (needs a GPU; not part of CI)"
	@echo "make bench-gpu  the GPU benchmark against PyTorch on the same GPU (tests/bench/bench_gpu.py)"
	@echo "make clean      remove build/"
	@echo "V=1             show full compiler command lines"

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# GPU tests (not part of CI): every CUDA op and the whole CUDA model against
# the CPU reference, then a tiny recipe trained on both. Needs a GPU and nvcc.
GPU_BUILD := build/cuda
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/test_*.c))
.PHONY: test-gpu gpu-test-build
gpu-test-build:
	@$(MAKE) --no-print-directory -j4 CUDA=1 BUILD=$(GPU_BUILD) $(GPU_BUILD)/megatrain \
	  $(GPU_TEST_SRC:tests/gpu/%.c=$(GPU_BUILD)/gpu-tests/%)

$(BUILD)/gpu-tests/%: tests/gpu/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	$(Q)$(CC) $(CFLAGS) -Itests/gpu -o $@ $< $(LIB_OBJ) $(LDLIBS) -lcmocka

test-gpu: deps
	@$(MAKE) --no-print-directory gpu-test-build
	@bash tests/gpu/run_gpu_tests.sh

# The GPU benchmark against PyTorch on the same GPU (needs torch and transformers there).
.PHONY: bench-gpu
bench-gpu:
	@$(MAKE) --no-print-directory CUDA=1 BUILD=$(GPU_BUILD) $(GPU_BUILD)/megatrain
	python3 tests/bench/bench_gpu.py --megatrain $(GPU_BUILD)/megatrain

include tests/mutants/mutants.mk
