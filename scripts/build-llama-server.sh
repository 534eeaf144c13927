#!/usr/bin/env bash
# Build llama.cpp's llama-server from the source vendored in llama-cpp-python's sdist, once.
#
# No llama.cpp package exists in Debian and PyPI ships it only as source; this builds the
# one binary the agent runs (docs/development.md). The result is cached outside the
# checkout, in ${LLMGW_CACHE:-$HOME/.cache/llmgw}/llama-server, and reused when present.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${LLMGW_CACHE:-$HOME/.cache/llmgw}"
OUT="$CACHE/llama-server"
built() { [ -x "$OUT" ] && "$OUT" --version >/dev/null 2>&1; }
if built; then
  echo "$OUT"
  exit 0
fi
# One build at a time on a machine (two checkouts' test runs): a second waits for the
# first, then finds its binary.
mkdir -p "$CACHE"
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.build.lock"
  flock 9
  if built; then
    echo "$OUT"
    exit 0
  fi
fi
# pip, to fetch the sdist: the checkout's .venv's (run.py makes it; Debian's python3 has
# no pip), else PIP, else python3's own.
here="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${PIP:-}" ]; then
  read -r -a pip <<<"$PIP"
elif [ -x "$here/.venv/bin/python" ]; then
  pip=("$here/.venv/bin/python" -m pip)
else
  pip=(python3 -m pip)
fi
if ! "${pip[@]}" --version >/dev/null 2>&1; then
  echo "building llama-server needs pip to fetch llama.cpp's source: run python3 run.py once" \
    "(it makes .venv), or set PIP to a pip command" >&2
  exit 1
fi
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v c++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >&2 && apt-get install -y -qq "${need[@]}" >&2
  else
    echo "building llama-server needs ${need[*]}: install them (Debian: sudo apt-get install ${need[*]})," \
      "or set LLMGW_LLAMA_SERVER to a llama-server binary" >&2
    exit 1
  fi
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${pip[@]}" download --quiet --disable-pip-version-check --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$VERSION" >&2
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$CACHE"
cp "$work/build/bin/llama-server" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
