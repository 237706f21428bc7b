# tcps — top-level build.
#
#   make            cargo build --release, then the C examples (examples/build/)
#   make examples   only the C examples (builds libtcps.so first if it is missing)
#   make test       every test (scripts/test.sh)
#   make demo       the web server demo: tcps vs kernel sockets (scripts/demo.sh)
#   make clean      cargo clean and examples/build

ifeq ($(origin CC),default)
CC := gcc
endif
CARGO   ?= cargo
CFLAGS  ?= -O2 -g -Wall -Wextra
LIBDIR  := $(abspath target/release)
EXCFLAGS  := $(CFLAGS) -pthread -I include
EXLDFLAGS := -L $(LIBDIR) -ltcps -Wl,-rpath,$(LIBDIR) -pthread

BUILD    := examples/build
EXAMPLES := $(BUILD)/webserver $(BUILD)/echo

.PHONY: all examples test demo clean

all:
	$(CARGO) build --release
	$(MAKE) --no-print-directory examples

examples: $(EXAMPLES)

# Relinks when libtcps.so changes, so `make` after a cargo rebuild picks up
# a new ABI.
$(BUILD)/%: examples/%.c examples/net.h include/tcps.h $(LIBDIR)/libtcps.so | $(BUILD)
	$(CC) $(EXCFLAGS) -o $@ $< $(EXLDFLAGS)

$(LIBDIR)/libtcps.so:
	$(CARGO) build --release -p tcps-host

$(BUILD):
	mkdir -p $@

test: all
	./scripts/test.sh

demo:
	./scripts/demo.sh

clean:
	$(CARGO) clean
	rm -rf $(BUILD)
