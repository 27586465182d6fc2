#!/usr/bin/env bash
# `make fuzz-asan`: the rocketmq_read fuzz target (targets.py) with codec/_rocketmq_rebuild.c built under
# AddressSanitizer and UndefinedBehaviorSanitizer, so that a read or write outside a buffer, or an overflow, in the
# C code stops the run even where it would not crash. First the tests of storage/common/_positioned_writes.c
# (tests/unit/test_positioned_writes.py) run against that module built the same way. The source tree is copied to a temp dir and the extension
# compiled there. atheris cannot steer by coverage with the sanitizers' runtime preloaded, so this replays the
# target's seeds and the corpus a coverage-guided run left (build/fuzz/rocketmq_read/corpus, from `make fuzz-long`
# or `tests/fuzz/run.py rocketmq_read`), each input then mutated at random (byte flips, 32-bit fields, cuts,
# splices) for SECONDS seconds (default 120). Exit 1 at the first sanitizer report or broken oracle.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tidelog-fuzz-asan.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -r src "$tmp/src"
rm -f "$tmp"/src/tidelog/codec/_rocketmq_rebuild*.so "$tmp"/src/tidelog/storage/common/_positioned_writes*.so
include=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
for module in codec/_rocketmq_rebuild storage/common/_positioned_writes; do
    cc -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -fPIC -shared \
        -I"$include" "src/tidelog/$module.c" -o "$tmp/src/tidelog/$module$suffix"
done
sanitized=(env "LD_PRELOAD=$(cc -print-file-name=libasan.so):$(cc -print-file-name=libubsan.so)"
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1)
"${sanitized[@]}" PYTHONPATH="$tmp/src" "$PY" -c "from tidelog.storage.common import _positioned_writes as m; import sys; \
assert m.__file__.startswith(sys.argv[1]), m.__file__" "$tmp/src" # the sanitized build is the one imported
"${sanitized[@]}" PYTHONPATH="$tmp/src" "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_positioned_writes.py
"${sanitized[@]}" PYTHONPATH="$tmp/src:tests/fuzz" "$PY" - "${SECONDS_TO_RUN:-120}" "$tmp/src" <<'PYTHON'
import random, sys, time
from pathlib import Path

import targets
from tidelog.codec import rocketmq_batches

assert rocketmq_batches.__file__.startswith(sys.argv[2]), rocketmq_batches.__file__  # the sanitized build
corpus = [*targets.rocketmq_read_seeds(), *(p.read_bytes() for p in Path("build/fuzz/rocketmq_read/corpus").glob("*"))]
rng, deadline, inputs = random.Random(), time.monotonic() + float(sys.argv[1]), 0
for data in corpus:
    targets.fuzz_rocketmq_read(data)
while time.monotonic() < deadline:
    data = bytearray(rng.choice(corpus))
    for _ in range(rng.randrange(1, 8)):
        if not data:
            break
        at = rng.randrange(len(data))
        mutation = rng.randrange(4)
        if mutation == 0:
            data[at] = rng.randrange(256)
        elif mutation == 1:
            data[at : at + 4] = rng.randrange(-(2**31), 2**31).to_bytes(4, "big", signed=True)
        elif mutation == 2:
            del data[at : at + rng.randrange(1, 40)]
        else:
            other = rng.choice(corpus)
            data[at:] = other[rng.randrange(len(other)) :]
    if data:
        targets.fuzz_rocketmq_read(bytes(data))
        inputs += 1
print(f"fuzz-asan: {len(corpus)} corpus inputs and {inputs:,} mutations of them, no sanitizer report")
PYTHON
