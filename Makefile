# tcps — top-level build.
#
#   make            cargo build --release, then the C examples (examples/build/)
#   make examples   only the C examples (builds libtcps.so first if it is missing)
#   make test       every test (scripts/test.sh)
#   make demo       the web server demo: tcps vs kernel sockets (scripts/demo.sh)
#   make install    install system-wide: PREFIX=/usr/local, DESTDIR= for packaging
#                   (binary, libraries, header, pkg-config, man pages, bash
#                   completion, example config, systemd units, licences)
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

PREFIX  ?= /usr/local
DESTDIR ?=
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
INSTALL ?= install

.PHONY: all examples test demo clean install

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

# `tcps run` finds the preload library in $(PREFIX)/lib/tcps, next to the
# binary's ../lib/tcps. The systemd units get ExecStart=$(PREFIX)/bin/tcps.
install:
	$(CARGO) build --release -p tcps-cli -p tcps-host -p tcps-preload
	$(INSTALL) -D -m 0755 target/release/tcps $(DESTDIR)$(PREFIX)/bin/tcps
	$(INSTALL) -D -m 0755 target/release/libtcps.so $(DESTDIR)$(PREFIX)/lib/libtcps.so
	$(INSTALL) -D -m 0755 target/release/libtcps_preload.so $(DESTDIR)$(PREFIX)/lib/tcps/libtcps_preload.so
	$(INSTALL) -D -m 0644 include/tcps.h $(DESTDIR)$(PREFIX)/include/tcps.h
	mkdir -p $(DESTDIR)$(PREFIX)/lib/pkgconfig
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' contrib/pkgconfig/tcps.pc.in \
		> $(DESTDIR)$(PREFIX)/lib/pkgconfig/tcps.pc
	target/release/tcps man $(DESTDIR)$(PREFIX)/share/man/man1
	mkdir -p $(DESTDIR)$(PREFIX)/share/bash-completion/completions
	target/release/tcps completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/tcps
	$(INSTALL) -D -m 0644 docs/tcps.conf $(DESTDIR)$(PREFIX)/share/doc/tcps/tcps.conf
	$(INSTALL) -D -m 0644 README.md $(DESTDIR)$(PREFIX)/share/doc/tcps/README.md
	$(INSTALL) -D -m 0644 LICENSE-MIT $(DESTDIR)$(PREFIX)/share/doc/tcps/LICENSE-MIT
	$(INSTALL) -D -m 0644 LICENSE-APACHE $(DESTDIR)$(PREFIX)/share/doc/tcps/LICENSE-APACHE
	mkdir -p $(DESTDIR)$(PREFIX)/lib/systemd/system
	for u in tcps.service tcps.socket tcps-run.conf; do \
		case $$u in *.conf) to=share/doc/tcps ;; *) to=lib/systemd/system ;; esac; \
		mkdir -p $(DESTDIR)$(PREFIX)/$$to; \
		sed 's|/usr/local/bin/tcps|$(PREFIX)/bin/tcps|; s|/usr/local/share/doc/tcps|$(PREFIX)/share/doc/tcps|' \
			contrib/systemd/$$u > $(DESTDIR)$(PREFIX)/$$to/$$u; \
	done

clean:
	$(CARGO) clean
	rm -rf $(BUILD)
