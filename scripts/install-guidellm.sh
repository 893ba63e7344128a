#!/bin/sh
# guidellm (PyPI), the serving harness, in a virtualenv of its own: DIR (default
# .venv-guidellm). benchmarks/guidellm_scenarios.py runs it against edge-llm.
# torch==2.13.0 first: guidellm imports torch (its data loader) and plain `torch`
# would pull a CUDA build of several GB; this pin takes the CPU build where the
# machine has it (about 1.5 GB in all). gguf: transformers reads the served model's
# tokenizer from its GGUF with it (no model hub).
set -eu
DIR="${1:-.venv-guidellm}"
GUIDELLM_VERSION="0.8.1"
if [ -x "$DIR/bin/guidellm" ] && "$DIR/bin/guidellm" --version 2>/dev/null | grep -q "$GUIDELLM_VERSION"; then
    exit 0
fi
python3 -m venv "$DIR"
"$DIR/bin/pip" install --quiet --upgrade pip
"$DIR/bin/pip" install --quiet "torch==2.13.0"
"$DIR/bin/pip" install --quiet "guidellm==$GUIDELLM_VERSION" gguf
"$DIR/bin/guidellm" --version
