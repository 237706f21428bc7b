# tcps — top-level build.
#
#   make            cargo build --release, then the C examples (examples/build/)
#   make examples   only the C examples (builds libtcps.so first if it is missing)
#   make test       every test (scripts/test.sh)
#   make demo       the web server demo: tcps vs kernel sockets (scripts/demo.sh)
#   make clean      cargo clean and examples/build
#   make install    PREFIX=/usr/local [DESTDIR=]: the tcps binary, libtcps.so,
#                   libtcps_preload.so (PREFIX/lib/tcps/, where `tcps run`
#                   looks), tcps.h, tcps.pc, man pages, shell completions,
#                   the systemd units (SYSTEMD_UNIT_DIR), docs and licenses
#   make uninstall  removes what `make install` installed (same variables)

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

.PHONY: all examples test demo clean install uninstall generated

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

# --- install ---------------------------------------------------------------
# GNU-style directory variables; DESTDIR is prepended to every one (staged
# installs for packages). `tcps run` finds the preload library at
# ../lib/tcps/ relative to the tcps binary: keep bindir = PREFIX/bin (the
# default) or set TCPS_PRELOAD_LIB.
PREFIX      ?= /usr/local
DESTDIR     ?=
bindir      ?= $(PREFIX)/bin
libdir      ?= $(PREFIX)/lib
pkglibdir   := $(PREFIX)/lib/tcps
includedir  ?= $(PREFIX)/include
datadir     ?= $(PREFIX)/share
mandir      ?= $(datadir)/man
docdir      ?= $(datadir)/doc/tcps
pkgconfigdir ?= $(libdir)/pkgconfig
bashcompdir ?= $(datadir)/bash-completion/completions
zshcompdir  ?= $(datadir)/zsh/site-functions
fishcompdir ?= $(datadir)/fish/vendor_completions.d
# /usr/local/lib/systemd/system is on systemd's search path; a package
# building for /usr sets SYSTEMD_UNIT_DIR=/usr/lib/systemd/system.
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
GEN     := target/generated
INSTALL ?= install
# The units name /usr/local/bin/tcps; installed, they name $(bindir)/tcps.
UNITS    := $(wildcard contrib/systemd/*.service contrib/systemd/*.socket)
UNIT_EXAMPLES := $(wildcard contrib/systemd/*.conf)
DOCS     := README.md $(wildcard docs/*.md docs/tcps.conf) LICENSE-MIT LICENSE-APACHE

# Man pages, completions and tcps.pc, written afresh at every install (a
# fraction of a second) so they always match the binary and PREFIX.
generated: target/release/tcps
	rm -rf $(GEN)
	target/release/tcps generate man $(GEN)/man
	target/release/tcps generate completions $(GEN)/completions
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(libdir)|' \
	    -e 's|@INCLUDEDIR@|$(includedir)|' -e 's|@VERSION@|$(VERSION)|' \
	    packaging/tcps.pc.in > $(GEN)/tcps.pc

# Built only if missing: run `make` first (as yourself), then `make install`.
target/release/tcps target/release/libtcps.so target/release/libtcps_preload.so:
	$(CARGO) build --release

install: target/release/tcps target/release/libtcps.so target/release/libtcps_preload.so generated
	$(INSTALL) -d $(DESTDIR)$(bindir) $(DESTDIR)$(libdir) $(DESTDIR)$(pkglibdir) \
	    $(DESTDIR)$(includedir) $(DESTDIR)$(pkgconfigdir) $(DESTDIR)$(mandir)/man1 \
	    $(DESTDIR)$(bashcompdir) $(DESTDIR)$(zshcompdir) $(DESTDIR)$(fishcompdir) \
	    $(DESTDIR)$(docdir) $(DESTDIR)$(SYSTEMD_UNIT_DIR)
	$(INSTALL) -m 755 target/release/tcps $(DESTDIR)$(bindir)/tcps
	$(INSTALL) -m 755 target/release/libtcps.so $(DESTDIR)$(libdir)/libtcps.so
	$(INSTALL) -m 755 target/release/libtcps_preload.so $(DESTDIR)$(pkglibdir)/libtcps_preload.so
	$(INSTALL) -m 644 include/tcps.h $(DESTDIR)$(includedir)/tcps.h
	$(INSTALL) -m 644 $(GEN)/tcps.pc $(DESTDIR)$(pkgconfigdir)/tcps.pc
	$(INSTALL) -m 644 $(GEN)/man/*.1 $(DESTDIR)$(mandir)/man1/
	$(INSTALL) -m 644 $(GEN)/completions/tcps.bash $(DESTDIR)$(bashcompdir)/tcps
	$(INSTALL) -m 644 $(GEN)/completions/_tcps $(DESTDIR)$(zshcompdir)/_tcps
	$(INSTALL) -m 644 $(GEN)/completions/tcps.fish $(DESTDIR)$(fishcompdir)/tcps.fish
	$(INSTALL) -m 644 $(DOCS) $(UNIT_EXAMPLES) $(DESTDIR)$(docdir)/
	for u in $(UNITS); do \
	    sed -e 's|/usr/local/bin/tcps|$(bindir)/tcps|g' \
	        -e 's|/usr/local/share/doc/tcps|$(docdir)|g' "$$u" \
	        > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$(basename "$$u") || exit 1; \
	    chmod 644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$(basename "$$u"); \
	done

# Removes exactly the files install writes (the man pages and units by the
# names in the source tree), then the directories tcps owns.
uninstall:
	rm -f $(DESTDIR)$(bindir)/tcps $(DESTDIR)$(libdir)/libtcps.so \
	    $(DESTDIR)$(pkglibdir)/libtcps_preload.so $(DESTDIR)$(includedir)/tcps.h \
	    $(DESTDIR)$(pkgconfigdir)/tcps.pc $(DESTDIR)$(mandir)/man1/tcps.1 \
	    $(DESTDIR)$(mandir)/man1/tcps-*.1 $(DESTDIR)$(bashcompdir)/tcps \
	    $(DESTDIR)$(zshcompdir)/_tcps $(DESTDIR)$(fishcompdir)/tcps.fish \
	    $(addprefix $(DESTDIR)$(SYSTEMD_UNIT_DIR)/,$(notdir $(UNITS)))
	rm -rf $(DESTDIR)$(docdir)
	-rmdir $(DESTDIR)$(pkglibdir) 2>/dev/null
