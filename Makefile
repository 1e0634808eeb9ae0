# minke — plain Makefile. `make help` lists the targets.
CC      ?= cc
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wno-format-truncation
OPT     ?= -O2 -g
ARCH    ?= -march=x86-64-v2 -mtune=native
CFLAGS  += $(CSTD) $(WARN) $(OPT) $(ARCH) -Iinclude -Isrc -fno-math-errno
LDLIBS  += -ljansson -lpcre2-8 -lutf8proc -lpthread -lm
BUILD   ?= build

SRC     := $(shell find src -name '*.c' ! -path 'src/cli/*' | sort)
CLI_SRC := $(shell find src/cli -name '*.c' | sort)
OBJ     := $(SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC:= $(sort $(wildcard tests/unit/*.c) $(wildcard tests/golden/*.c))
TEST_BIN:= $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC:= $(wildcard bench/*.c)
BENCH_BIN:= $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
FUZZ_SRC:= $(wildcard fuzz/*.c)

.PHONY: all test unit golden bench asan fuzz clean help
all: $(BUILD)/minke

help:
	@echo "make            build ./build/minke (the CLI) and build/libminke.a"
	@echo "make test       build and run every test (unit, golden DeepSeek-V4 cases, corruption, CLI,"
	@echo "                checkpoint generator, and a $(FUZZ_SMOKE_TIME) s fuzz smoke run)"
	@echo "make bench      CPU decode benchmark on a generated V4-shaped checkpoint vs memcpy bandwidth"
	@echo "make asan       build and run the tests with AddressSanitizer + UBSan (build-asan/)"
	@echo "make fuzz       build and run the libFuzzer targets for 60 s each (clang)"
	@echo "make clean      remove build outputs"

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

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
	@bash tests/tools/test_gen_dsv4.sh
	@$(MAKE) --no-print-directory $(BUILD)/tests/tokenizer/tok_cli && python3 tests/tokenizer/prop_test.py $(BUILD)
	@$(MAKE) --no-print-directory $(BUILD)/tests/tokenizer/gguf_cli && python3 tests/tokenizer/gguf_vs_llamacpp.py $(BUILD)
	@$(MAKE) --no-print-directory fuzz FUZZ_TIME=$(FUZZ_SMOKE_TIME)
	@echo "all tests passed"

bench: $(BUILD)/minke $(BENCH_BIN)
	bash bench/run_cpu.sh $(BUILD)

asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	        LDLIBS="-ljansson -lpcre2-8 -lutf8proc -lpthread -lm -fsanitize=address,undefined" test

FUZZ_TIME ?= 60
FUZZ_SMOKE_TIME ?= 15
fuzz:
	@mkdir -p build-fuzz
	@set -e; for f in $(FUZZ_SRC); do \
	  n=$$(basename $$f .c); \
	  clang $(CSTD) -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc $$f \
	    $$(find src -name '*.c' ! -path 'src/cli/*') -o build-fuzz/$$n -ljansson -lpcre2-8 -lutf8proc -lpthread -lm; \
	  mkdir -p build-fuzz/corpus-$$n; \
	  ./build-fuzz/$$n -max_total_time=$(FUZZ_TIME) -max_len=65536 build-fuzz/corpus-$$n fuzz/seeds/$$n; \
	done

clean:
	rm -rf build build-asan build-fuzz

-include $(OBJ:.o=.d) $(CLI_OBJ:.o=.d)
