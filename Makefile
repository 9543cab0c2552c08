# Build, test and train. `make` builds every program; `make test` runs every test; `make train`
# prepares the data if missing and trains GPT-2 124M on Tiny Shakespeare. `make -j` is safe, and
# `make test` and `make train` build on every core by themselves (a -j given wins).
#
# Options (make VAR=value):
#   GPU_ARCH   compute capability without the dot (90 for H100/H200). Default: read from the local GPU
#              with nvidia-smi; 90 (Hopper) where there is none, e.g. on CI.
#   PRECISION  BF16 (default) or FP32: which build `make train` runs. Both builds are always made,
#              side by side: train_gpt_bf16 / train_gpt_fp32 and test_gpt_bf16 / test_gpt_fp32.
#   PYTHON     the Python with PyTorch, numpy and tiktoken. Default: found (or installed) by
#              scripts/setup_python.sh on first use and remembered in build/python.
#   GPT_MIRROR folder holding the public inputs (offline machines); see README.md.
#   NCCL       1 (default where nccl.h is found) builds the data-parallel path (several GPUs); 0 builds
#              for one GPU only. NCCL_HOME: where NCCL is installed, if not with CUDA or in /usr.
#   RUN        the run folder of `make train` and `make generate` (default out/d12_tinyshakespeare_bf16).

NVCC ?= nvcc
PRECISION ?= BF16

# `make test` and `make train` as typed: the build is most of a first run's time, one nvcc per core.
# Only at the top level (a sub-make shares its parent's jobs) and where no -j was given: make 4.4
# shows a command line's -j here; make 4.3 does not, but lets the command line's win over this one.
ifeq ($(MAKELEVEL),0)
  ifneq ($(filter test train,$(MAKECMDGOALS)),)
    ifeq ($(filter -j%,$(MAKEFLAGS)),)
      MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
    endif
  endif
endif

GPU_ARCH ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.')
ifeq ($(strip $(GPU_ARCH)),)
  override GPU_ARCH := 90
endif
# Hopper's own instructions (wgmma, setmaxnreg) need the architecture-specific 90a target.
ifeq ($(GPU_ARCH),90)
  GENCODE := -gencode arch=compute_90a,code=sm_90a
else
  GENCODE := -gencode arch=compute_$(GPU_ARCH),code=[sm_$(GPU_ARCH),compute_$(GPU_ARCH)]
endif

NVCC_FLAGS := -O3 -std=c++17 $(GENCODE) -lineinfo -Xcompiler -Wall -I.
LDLIBS := -lcublas -lcublasLt

# NCCL: found beside nvcc, in /usr, or under NCCL_HOME. The programs that train link it.
NVCC_PATH := $(shell command -v $(NVCC) 2>/dev/null)
NCCL_HEADERS := $(wildcard $(dir $(NVCC_PATH))../include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h \
                           $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h))
NCCL ?= $(if $(NCCL_HEADERS),1,0)
ifeq ($(NCCL),1)
  ifneq ($(NCCL_HOME),)
    NVCC_FLAGS += -I$(NCCL_HOME)/include
    NCCL_LIBS := -L$(NCCL_HOME)/lib -Xlinker -rpath=$(NCCL_HOME)/lib
  endif
  NCCL_LIBS += -lnccl
else
  NVCC_FLAGS += -DNO_NCCL
  $(info NCCL not found: building for one GPU only (NCCL_HOME=... to point at it))
endif

ifeq ($(PRECISION),FP32)
  PRECISION_SUFFIX := fp32
else ifeq ($(PRECISION),BF16)
  PRECISION_SUFFIX := bf16
else
  $(error PRECISION must be FP32 or BF16, got '$(PRECISION)')
endif

HEADERS := $(wildcard *.cuh *.h)
TRAIN_BINS := $(if $(wildcard train_gpt.cu),train_gpt_bf16 train_gpt_fp32)
TEST_GPT_BINS := $(if $(wildcard test_gpt.cu),test_gpt_bf16 test_gpt_fp32)
GENERATE_BINS := $(if $(wildcard generate_gpt.cu),generate_gpt_bf16 generate_gpt_fp32)
EVAL_BINS := $(if $(wildcard eval_gpt.cu),eval_gpt_bf16 eval_gpt_fp32)
# Every dev/cuda/*.cu is a lab program, but the *_capi.cu C APIs (shared libraries, below). Every lab
# depends on every lab header beside it (dev/cuda/*.cuh) and on dev/lab.cuh, which the tests share.
DEV_LIBS := $(wildcard dev/cuda/*_capi.cu)
DEV_BINS := $(patsubst %.cu,%,$(filter-out $(DEV_LIBS),$(wildcard dev/cuda/*.cu)))
DEV_HEADERS := $(wildcard dev/cuda/*.cuh) dev/lab.cuh
UNIT_BINS := $(patsubst test/%.cu,build/test/%,$(wildcard test/*.cu))
PROGRAMS := $(TRAIN_BINS) $(TEST_GPT_BINS) $(GENERATE_BINS) $(EVAL_BINS) $(DEV_BINS) $(UNIT_BINS)

.PHONY: all test train generate clean list-programs python
all: $(PROGRAMS)

%_bf16: %.cu $(HEADERS) train_gpt.cu
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(LDLIBS) $(NCCL_LIBS)
%_fp32: %.cu $(HEADERS) train_gpt.cu
	$(NVCC) $(NVCC_FLAGS) -DENABLE_FP32 $< -o $@ $(LDLIBS) $(NCCL_LIBS)
dev/cuda/%: dev/cuda/%.cu $(HEADERS) $(DEV_HEADERS)
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(LDLIBS)
build/test/%: test/%.cu $(HEADERS) train_gpt.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(LDLIBS) $(NCCL_LIBS)
# The tests share the labs' helpers (timing, tolerance checks, the pass/fail count).
$(TEST_GPT_BINS) $(UNIT_BINS): dev/lab.cuh

# The LD_PRELOAD library that kills or fails file operations for the checkpoint tests (host C).
build/test/libfault_inject.so: test/fault_inject.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -shared -fPIC $< -o $@ -ldl
all: build/test/libfault_inject.so

# The test runner checks that every program in this list was built (one path a line).
list-programs:
	@printf '%s\n' $(PROGRAMS)

# The Python interpreter the tests and data preparation use (see PYTHON above).
build/python: scripts/setup_python.sh
	@mkdir -p build
	PYTHON="$(PYTHON)" bash scripts/setup_python.sh > $@.tmp && mv $@.tmp $@
RUN_PYTHON = $(if $(PYTHON),$(PYTHON),$$(cat build/python))

test: all build/python
	PYTHON="$(RUN_PYTHON)" bash test/run_tests.sh

# `make train` keeps a run folder (main.log, metrics.csv, the final checkpoint) and continues it when
# run again with a larger -x (it resumes: -y 1); `make generate` samples from its newest checkpoint.
RUN ?= out/d12_tinyshakespeare_$(PRECISION_SUFFIX)
train: train_gpt_$(PRECISION_SUFFIX) build/python
	$(RUN_PYTHON) data/prepare_tinyshakespeare.py
	./train_gpt_$(PRECISION_SUFFIX) -o $(RUN) -y 1 $(TRAIN_FLAGS)

PROMPT ?= ROMEO:
generate: generate_gpt_$(PRECISION_SUFFIX)
	./generate_gpt_$(PRECISION_SUFFIX) -e $(RUN) -p "$(PROMPT)" $(GENERATE_FLAGS)

clean:
	rm -rf build $(PROGRAMS)

# ---------------------------------------------------------------------------------------------
# The C APIs: shared libraries over the headers, for Python's ctypes. build/liblayernorm_capi.so
# (layernorm.cuh and the labs' CPU reference: dev/cuda/layernorm_vs_torch.py,
# test/test_layernorm_reference.py) and build/libattention_capi.so (flash_attention.cuh:
# dev/cuda/attention_vs_torch.py).
build/lib%.so: dev/cuda/%.cu $(HEADERS) $(DEV_HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -shared -Xcompiler -fPIC $< -o $@
all: $(patsubst dev/cuda/%.cu,build/lib%.so,$(DEV_LIBS))
