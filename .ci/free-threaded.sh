#!/usr/bin/env bash
# Builds a free-threaded CPython (./configure --disable-gil) from Debian trixie's python3.13 source
# package into PREFIX, inside CI's sid chroot: `bash free-threaded.sh PREFIX`. Debian packages no
# free-threaded interpreter, and the python3.14 and python3.15 source packages are not on the
# mirror. Built for testing, not for speed: -O1 and no debugging symbols, no test modules
# (about 2 minutes on 2 cores; the default -O3 -g build takes about 17). Ends with the interpreter's
# facts: free-threaded, and the GIL off.
set -euo pipefail
PREFIX=${1:?usage: free-threaded.sh PREFIX}
SPEC=python3.13=3.13.5-2+deb13u5
VERSION=3.13.5
mkdir -p /tmp/ft-build && cd /tmp/ft-build
apt-get -q -o Acquire::Check-Valid-Until=false source --download-only "$SPEC" >source.log 2>&1 ||
    { tail -5 source.log; exit 1; }
rm -rf "Python-$VERSION" && tar xf "python3.13_$VERSION.orig.tar.xz" && cd "Python-$VERSION"
./configure --disable-gil --prefix="$PREFIX" --with-ensurepip=install --disable-test-modules \
    OPT="-DNDEBUG -fwrapv -O1" >../configure.log 2>&1 || { tail -20 ../configure.log; exit 1; }
make -j"$(nproc)" >../make.log 2>&1 || { tail -30 ../make.log; exit 1; }
make install >../install.log 2>&1 || { tail -20 ../install.log; exit 1; }
"$PREFIX/bin/python3.13t" -VV
"$PREFIX/bin/python3.13t" -c '
import ctypes, ssl, sys, sysconfig, zlib  # what tensorbridge, pip and the suite need
assert sysconfig.get_config_var("Py_GIL_DISABLED") and not sys._is_gil_enabled()
print("free-threaded; GIL enabled:", sys._is_gil_enabled())'
