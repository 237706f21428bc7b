# tcps — top-level build.
#
#   make            cargo build --release, then the C examples (examples/build/)
#   make examples   only the C examples (builds libtcps.so first if it is missing)
#   make test       every test (scripts/test.sh)
#   make demo       the web server demo: tcps vs kernel sockets (scripts/demo.sh)
#   make install    install system-wide: PREFIX=/usr/local, DESTDIR= for packaging
#                   (binary, libraries, header, pkg-config, man pages, bash/zsh/fish
#                   completions, example config, systemd units, licences);
#                   SYSTEMD_UNIT_DIR= (default PREFIX/lib/systemd/system)
#   make uninstall  removes what `make install` installed (same variables)
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

.PHONY: all examples test demo clean install uninstall

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

# Where things go. `tcps run` finds the preload library at ../lib/tcps/
# relative to its own binary, so keep that layout (or set TCPS_PRELOAD_LIB).
# /usr/local/lib/systemd/system is on systemd's search path; a package for
# /usr sets SYSTEMD_UNIT_DIR=/usr/lib/systemd/system.
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
bindir      := $(PREFIX)/bin
libdir      := $(PREFIX)/lib
pkglibdir   := $(libdir)/tcps
includedir  := $(PREFIX)/include
mandir      := $(PREFIX)/share/man
docdir      := $(PREFIX)/share/doc/tcps
bashcompdir := $(PREFIX)/share/bash-completion/completions
zshcompdir  := $(PREFIX)/share/zsh/site-functions
fishcompdir := $(PREFIX)/share/fish/vendor_completions.d
# Units (ExecStart= names /usr/local/bin/tcps; installed, $(bindir)/tcps)
# and drop-in examples (to the docs).
UNITS         := $(wildcard contrib/systemd/*.service contrib/systemd/*.socket)
UNIT_EXAMPLES := $(wildcard contrib/systemd/*.conf)
GEN           := target/generated

install:
	$(CARGO) build --release -p tcps-cli -p tcps-host -p tcps-preload
	rm -rf $(GEN)
	target/release/tcps man $(GEN)/man
	mkdir -p $(GEN)/completions
	target/release/tcps completions bash > $(GEN)/completions/tcps.bash
	target/release/tcps completions zsh > $(GEN)/completions/_tcps
	target/release/tcps completions fish > $(GEN)/completions/tcps.fish
	$(INSTALL) -d $(DESTDIR)$(bindir) $(DESTDIR)$(pkglibdir) $(DESTDIR)$(includedir) \
		$(DESTDIR)$(libdir)/pkgconfig $(DESTDIR)$(mandir)/man1 $(DESTDIR)$(docdir) \
		$(DESTDIR)$(bashcompdir) $(DESTDIR)$(zshcompdir) $(DESTDIR)$(fishcompdir) \
		$(DESTDIR)$(SYSTEMD_UNIT_DIR)
	$(INSTALL) -m 0755 target/release/tcps $(DESTDIR)$(bindir)/tcps
	$(INSTALL) -m 0755 target/release/libtcps.so $(DESTDIR)$(libdir)/libtcps.so
	$(INSTALL) -m 0755 target/release/libtcps_preload.so $(DESTDIR)$(pkglibdir)/libtcps_preload.so
	$(INSTALL) -m 0644 include/tcps.h $(DESTDIR)$(includedir)/tcps.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' contrib/pkgconfig/tcps.pc.in \
		> $(DESTDIR)$(libdir)/pkgconfig/tcps.pc
	$(INSTALL) -m 0644 $(GEN)/man/*.1 $(DESTDIR)$(mandir)/man1/
	$(INSTALL) -m 0644 $(GEN)/completions/tcps.bash $(DESTDIR)$(bashcompdir)/tcps
	$(INSTALL) -m 0644 $(GEN)/completions/_tcps $(DESTDIR)$(zshcompdir)/_tcps
	$(INSTALL) -m 0644 $(GEN)/completions/tcps.fish $(DESTDIR)$(fishcompdir)/tcps.fish
	$(INSTALL) -m 0644 README.md docs/tcps.conf LICENSE-MIT LICENSE-APACHE $(UNIT_EXAMPLES) \
		$(DESTDIR)$(docdir)/
	for u in $(UNITS); do \
		sed -e 's|/usr/local/bin/tcps|$(bindir)/tcps|g' \
		    -e 's|/usr/local/share/doc/tcps|$(docdir)|g' "$$u" \
			> $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$(basename "$$u") || exit 1; \
		chmod 0644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$(basename "$$u"); \
	done

# Directories install may have made that are not a prefix's standard ones
# (bin, lib, include, share/man/man1 stay): each is removed by uninstall
# if it is left empty, children before their parents.
MADE_DIRS := $(libdir)/pkgconfig $(SYSTEMD_UNIT_DIR) $(dir $(SYSTEMD_UNIT_DIR:/=)) \
	$(bashcompdir) $(dir $(bashcompdir)) $(zshcompdir) $(dir $(zshcompdir)) \
	$(fishcompdir) $(dir $(fishcompdir))

# Removes exactly what install writes (units by their names in the source
# tree), then the directories that are tcps's own, then those of
# MADE_DIRS that are left empty.
uninstall:
	rm -f $(DESTDIR)$(bindir)/tcps $(DESTDIR)$(libdir)/libtcps.so \
		$(DESTDIR)$(pkglibdir)/libtcps_preload.so $(DESTDIR)$(includedir)/tcps.h \
		$(DESTDIR)$(libdir)/pkgconfig/tcps.pc $(DESTDIR)$(mandir)/man1/tcps.1 \
		$(DESTDIR)$(mandir)/man1/tcps-*.1 $(DESTDIR)$(bashcompdir)/tcps \
		$(DESTDIR)$(zshcompdir)/_tcps $(DESTDIR)$(fishcompdir)/tcps.fish \
		$(addprefix $(DESTDIR)$(SYSTEMD_UNIT_DIR)/,$(notdir $(UNITS)))
	rm -rf $(DESTDIR)$(docdir)
	-rmdir $(DESTDIR)$(pkglibdir)
	for d in $(MADE_DIRS); do \
		if [ -d "$(DESTDIR)$$d" ]; then rmdir --ignore-fail-on-non-empty "$(DESTDIR)$$d"; fi; \
	done

clean:
	$(CARGO) clean
	rm -rf $(BUILD)
