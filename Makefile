# minke — plain Makefile. `make help` lists the targets.
CC      ?= cc
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wno-format-truncation
OPT     ?= -O2 -g
ARCH    ?= -march=x86-64-v2 -mtune=native
CFLAGS  += $(CSTD) $(WARN) $(OPT) $(ARCH) -Iinclude -Isrc -fno-math-errno
LDLIBS  += -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lpthread -lm -lcurl
BUILD   ?= build

# Host sources of the library; *_cuda.c files are the CUDA backend's host code, built by `make cuda`.
SRC     := $(shell find src -name '*.c' ! -path 'src/cli/*' ! -name '*_cuda.c' | sort)
CLI_SRC := $(shell find src/cli -name '*.c' | sort)
OBJ     := $(SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC:= $(sort $(wildcard tests/unit/*.c) $(wildcard tests/golden/*.c))
TEST_BIN:= $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC:= $(wildcard bench/*.c)
BENCH_BIN:= $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
FUZZ_SRC:= $(wildcard fuzz/*.c)

.PHONY: all test unit golden bench asan asan-run fuzz clean help
all: $(BUILD)/minke

help:
	@echo "make            build ./build/minke (the CLI) and build/libminke.a"
	@echo "make test       build and run every test (unit, golden DeepSeek-V4 cases, corruption, CLI,"
	@echo "                checkpoint generator, a $(FUZZ_SMOKE_TIME) s fuzz smoke run, and make cuda + the CUDA"
	@echo "                tests, which skip without a GPU, when the CUDA toolkit is installed)"
	@echo "make bench      CPU decode benchmark on a generated V4-shaped checkpoint vs memcpy bandwidth"
	@echo "make asan       build and run the tests with AddressSanitizer + UBSan (build-asan/)"
	@echo "make fuzz       build and run the libFuzzer targets for 60 s each (clang)"
	@echo "make clean      remove build outputs"
	@echo "make cuda       build the CUDA backend, its tests, the GPU benchmarks and build-cuda/minke (--device cuda)"
	@echo "                into build-cuda/ (nvcc, no GPU needed)"

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# GET /version reports the commit the server was built from
GIT_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
$(BUILD)/src/server/misc.o: CFLAGS += -DMK_GIT_COMMIT=\"$(GIT_COMMIT)\"

$(BUILD)/libminke.a: $(OBJ)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

$(BUILD)/minke: $(CLI_OBJ) $(BUILD)/libminke.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libminke.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libminke.a tests/test_util.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libminke.a $(LDLIBS) -lcriterion

$(BUILD)/bench/%: bench/%.c $(BUILD)/libminke.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libminke.a $(LDLIBS)

test: $(BUILD)/minke $(TEST_BIN)
	@set -e; for t in $(TEST_BIN); do echo "== $$t"; $$t --jobs 2 $(TEST_ARGS); done
	@bash tests/cli/test_cli.sh $(BUILD)/minke
	@bash tests/server/run.sh $(BUILD)/minke
	@bash tests/bench/test_bench.sh $(BUILD)/minke
	@bash tests/tools/test_gen_dsv4.sh
	@$(MAKE) --no-print-directory $(BUILD)/tests/tokenizer/tok_cli && python3 tests/tokenizer/prop_test.py $(BUILD)
	@$(MAKE) --no-print-directory $(BUILD)/tests/tokenizer/gguf_cli && python3 tests/tokenizer/gguf_vs_llamacpp.py $(BUILD)
	@python3 tests/llama/test_vs_llamacpp.py $(BUILD)/minke
	@$(MAKE) --no-print-directory fuzz FUZZ_TIME=$(FUZZ_SMOKE_TIME)
	@if [ -x "$(NVCC)" ]; then $(MAKE) --no-print-directory cuda && $(CUDA_BUILD)/test_ops_cuda && $(CUDA_BUILD)/test_dsv4_cuda && $(CUDA_BUILD)/test_dsv4_paged_cuda && \
	   $(CUDA_BUILD)/test_dsv4_engine_cuda; \
	 else echo "skip: make cuda (no CUDA toolkit at $(NVCC))"; fi
	@echo "all tests passed"

bench: $(BUILD)/minke $(BENCH_BIN)
	bash bench/run_cpu.sh $(BUILD)

# AddressSanitizer + UBSan build (build-asan/): the C unit and golden tests, the CLI tests and the
# server suite (tests/server, through the OpenAI and Anthropic SDKs) against the sanitized server.
asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	        LDLIBS="-ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lpthread -lm -lcurl -fsanitize=address,undefined" asan-run

asan-run: export LSAN_OPTIONS = suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0
asan-run: $(BUILD)/minke $(TEST_BIN)
	@set -e; for t in $(TEST_BIN); do echo "== $$t"; $$t --jobs 2 $(TEST_ARGS); done
	@bash tests/cli/test_cli.sh $(BUILD)/minke
	@bash tests/server/run.sh $(BUILD)/minke
	@echo "asan: all tests passed"

FUZZ_TIME ?= 60
FUZZ_SMOKE_TIME ?= 15
fuzz:
	@mkdir -p build-fuzz
	@set -e; for f in $(FUZZ_SRC); do \
	  n=$$(basename $$f .c); \
	  clang $(CSTD) -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc $$f \
	    $$(find src -name '*.c' ! -path 'src/cli/*' ! -name '*_cuda.c') -o build-fuzz/$$n -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lpthread -lm -lcurl; \
	  mkdir -p build-fuzz/corpus-$$n; \
	  ./build-fuzz/$$n -max_total_time=$(FUZZ_TIME) -max_len=65536 build-fuzz/corpus-$$n fuzz/seeds/$$n; \
	done

clean:
	rm -rf build build-asan build-fuzz

-include $(OBJ:.o=.d) $(CLI_OBJ:.o=.d)

# ---- CUDA backend: `make cuda` builds src/ops/cuda (nvcc), the op tests, the GPU benchmarks and the
# whole program with the CUDA backend (build-cuda/minke, `--device cuda`) into build-cuda/ (needs the
# CUDA toolkit, not a GPU; the tests skip cleanly without a device). Every host object in build-cuda/
# is compiled with -DMK_WITH_CUDA (src/models/model.c and batch.c then reach the GPU model).
# CUDA_GENCODE=... narrows the targets (bench/gpu/run.sh builds sm_90a only); CUBLAS=0 builds
# without cuBLAS (bf16 GEMM then runs as chunked GEMVs).
CUDA         ?= /usr/local/cuda
NVCC         ?= $(CUDA)/bin/nvcc
CUDA_GENCODE ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_100a,code=sm_100a
CUBLAS       ?= $(shell test -e $(CUDA)/lib64/libcublas.so && echo 1 || echo 0)
CUDA_BUILD   := build-cuda
NVCC_WARN    ?= -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-Werror -Werror all-warnings
NVCCFLAGS    ?= -O3 -std=c++17 -lineinfo $(CUDA_GENCODE) -Iinclude -Isrc -DMK_HAVE_CUBLAS=$(CUBLAS) $(NVCC_WARN)
CUDA_CU      := $(sort $(wildcard src/ops/cuda/*.cu))
CUDA_OBJ     := $(CUDA_CU:%.cu=$(CUDA_BUILD)/%.o)
CUDA_HOST_SRC:= $(sort $(wildcard src/ops/cpu/*.c)) src/num/formats.c src/base/status.c src/base/threads.c src/base/cpu.c
CUDA_HOST_OBJ:= $(CUDA_HOST_SRC:%.c=$(CUDA_BUILD)/%.o)
CUDA_LIBS    := -L$(CUDA)/lib64 -Xlinker -rpath -Xlinker $(CUDA)/lib64 $(if $(filter 1,$(CUBLAS)),-lcublas) -lpthread -lm
CUDA_HDR     := src/ops/cuda/cuda_common.cuh src/ops/cuda/ops_cuda.h src/ops/ops.h src/base/status.h include/minke.h \
                src/num/sample_math.h

# The DeepSeek-V4 GPU forward (src/models/dsv4_cuda.c) and the CPU model sources it needs, built
# with the host compiler; JANSSON_LIB / JANSSON_INC let a machine without libjansson-dev link a
# carried static copy (bench/gpu/run.sh).
JANSSON_LIB  ?= -ljansson
JANSSON_INC  ?=
CUDA_DSV4_SRC:= src/models/dsv4_cuda.c src/models/dsv4.c src/models/dsv4_load.c src/models/dsv4_golden.c src/io/safetensors.c
CUDA_DSV4_OBJ:= $(CUDA_DSV4_SRC:%.c=$(CUDA_BUILD)/%.o)

.PHONY: cuda cuda-clean
cuda: $(CUDA_BUILD)/test_ops_cuda $(CUDA_BUILD)/bench_gpu $(CUDA_BUILD)/test_dsv4_cuda $(CUDA_BUILD)/test_dsv4_paged_cuda $(CUDA_BUILD)/bench_dsv4_cuda \
      $(CUDA_BUILD)/minke $(CUDA_BUILD)/test_dsv4_engine_cuda

$(CUDA_BUILD)/src/ops/cuda/%.o: src/ops/cuda/%.cu $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(CUDA_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMK_WITH_CUDA $(JANSSON_INC) -MMD -MP -c $< -o $@

# (the host sampler too: the GPU draw is checked against it)
$(CUDA_BUILD)/test_ops_cuda: $(CUDA_BUILD)/tests/ops/test_ops_cuda.o $(CUDA_OBJ) $(CUDA_HOST_OBJ) \
                             $(CUDA_BUILD)/src/engine/sampler.o $(CUDA_BUILD)/src/engine/philox.o
	$(NVCC) $(CUDA_GENCODE) -o $@ $^ $(CUDA_LIBS) $(JANSSON_LIB)

$(CUDA_BUILD)/bench_gpu: bench/gpu/bench_gpu.cu $(CUDA_OBJ) $(CUDA_HOST_OBJ) $(CUDA_HDR)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(CUDA_OBJ) $(CUDA_HOST_OBJ) $(CUDA_LIBS)

$(CUDA_BUILD)/test_dsv4_cuda: $(CUDA_BUILD)/tests/ops/test_dsv4_cuda.o $(CUDA_DSV4_OBJ) $(CUDA_OBJ) $(CUDA_HOST_OBJ)
	$(NVCC) $(CUDA_GENCODE) -o $@ $^ $(CUDA_LIBS) $(JANSSON_LIB)

$(CUDA_BUILD)/test_dsv4_paged_cuda: $(CUDA_BUILD)/tests/ops/test_dsv4_paged_cuda.o $(CUDA_DSV4_OBJ) $(CUDA_OBJ) $(CUDA_HOST_OBJ)
	$(NVCC) $(CUDA_GENCODE) -o $@ $^ $(CUDA_LIBS) $(JANSSON_LIB)

$(CUDA_BUILD)/bench_dsv4_cuda: $(CUDA_BUILD)/bench/gpu/bench_dsv4_cuda.o $(CUDA_DSV4_OBJ) $(CUDA_OBJ) $(CUDA_HOST_OBJ) \
                               $(CUDA_BUILD)/src/engine/sampler.o $(CUDA_BUILD)/src/engine/philox.o
	$(NVCC) $(CUDA_GENCODE) -o $@ $^ $(CUDA_LIBS) $(JANSSON_LIB)

# build-cuda/minke: every host source of build/minke (and src/models/dsv4_cuda.c) compiled into
# build-cuda/ with -DMK_WITH_CUDA, plus the CUDA objects, linked by nvcc with the program's libraries
# and cuBLAS. The GPU engine test links the same library (no server libraries needed at run time).
CUDA_LIB_OBJ := $(SRC:%.c=$(CUDA_BUILD)/%.o) $(CUDA_BUILD)/src/models/dsv4_cuda.o
CUDA_CLI_OBJ := $(CLI_SRC:%.c=$(CUDA_BUILD)/%.o)
CUDA_MINKE_LIBS := $(JANSSON_LIB) -lpcre2-8 -lutf8proc -lmicrohttpd -lcurl -lpthread -lm
$(CUDA_BUILD)/src/server/misc.o: CFLAGS += -DMK_GIT_COMMIT=\"$(GIT_COMMIT)\"

$(CUDA_BUILD)/libminke.a: $(CUDA_LIB_OBJ)
	ar rcs $@ $^

$(CUDA_BUILD)/minke: $(CUDA_CLI_OBJ) $(CUDA_OBJ) $(CUDA_BUILD)/libminke.a
	$(NVCC) $(CUDA_GENCODE) -o $@ $(CUDA_CLI_OBJ) $(CUDA_OBJ) $(CUDA_BUILD)/libminke.a $(CUDA_LIBS) $(CUDA_MINKE_LIBS)

$(CUDA_BUILD)/test_dsv4_engine_cuda: $(CUDA_BUILD)/tests/ops/test_dsv4_engine_cuda.o $(CUDA_OBJ) $(CUDA_BUILD)/libminke.a
	$(NVCC) $(CUDA_GENCODE) -o $@ $< $(CUDA_OBJ) $(CUDA_BUILD)/libminke.a $(CUDA_LIBS) $(JANSSON_LIB)

cuda-clean:
	rm -rf $(CUDA_BUILD)

-include $(wildcard $(CUDA_BUILD)/src/*/*.d $(CUDA_BUILD)/src/*/*/*.d $(CUDA_BUILD)/tests/ops/*.d $(CUDA_BUILD)/bench/gpu/*.d)
