# k3repro runtime probe: what a vLLM install would load, read from files. POSIX sh, so it runs in any
# vLLM image; it imports nothing (no torch, no CUDA context) and only starts Python to ask for sys.path.
#
# Usage: sh probe.sh [PYTHON]   (default: python3 or python on PATH)
# Output: one `key=value` per line; nvidia_smi, compat_dir and compat_via may repeat. Unknown: omitted.

PY=${1:-$(command -v python3 || command -v python || true)}
CUDA_DIR=${CUDA_HOME:-/usr/local/cuda}

emit() { [ -n "$2" ] && printf '%s=%s\n' "$1" "$2"; }

sites=""
if [ -n "$PY" ] && [ -x "$PY" ]; then
  emit python_path "$PY"
  emit python "$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)"
  sites=$("$PY" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("-packages", "-packages/"))))' 2>/dev/null)
fi
if [ -z "$sites" ]; then
  sites=$(ls -d /usr/local/lib/python3*/dist-packages /usr/local/lib/python3*/site-packages \
    /usr/lib/python3/dist-packages /opt/*/lib/python3*/site-packages 2>/dev/null)
fi

# dist_version GLOB: the Version of the first installed distribution whose dist-info matches GLOB-*.
dist_version() {
  for site in $sites; do
    for info in "$site"/$1-*.dist-info; do
      [ -f "$info/METADATA" ] || continue
      sed -n 's/^Version: *//p' "$info/METADATA" | head -n 1
      return
    done
  done
}

emit vllm "$(dist_version vllm)"
emit torch "$(dist_version torch)"
emit transformers "$(dist_version transformers)"
nccl=$(dist_version 'nvidia_nccl_cu[0-9]*')
emit nccl "${nccl:-$(dist_version nvidia_nccl)}"

for site in $sites; do
  if [ -f "$site/torch/version.py" ]; then
    emit torch_cuda "$(sed -n "s/^cuda[^=]*= *['\"]\([^'\"]*\)['\"].*/\1/p" "$site/torch/version.py" | head -n 1)"
    break
  fi
done

runtime=""
if [ -f "$CUDA_DIR/version.json" ]; then
  runtime=$(tr -d ' \n\t' < "$CUDA_DIR/version.json" | sed -n 's/.*"cuda":{[^}]*"version":"\([^"]*\)".*/\1/p')
  [ -n "$runtime" ] && emit cuda_runtime_source "$CUDA_DIR/version.json"
fi
if [ -z "$runtime" ]; then
  runtime=$(dist_version 'nvidia_cuda_runtime_cu[0-9]*')
  [ -z "$runtime" ] && runtime=$(dist_version nvidia_cuda_runtime)
  [ -n "$runtime" ] && emit cuda_runtime_source "nvidia-cuda-runtime wheel"
fi
if [ -z "$runtime" ] && [ -n "${CUDA_VERSION:-}" ]; then
  runtime=$CUDA_VERSION
  emit cuda_runtime_source "CUDA_VERSION"
fi
emit cuda_runtime "$runtime"

# CUDA forward-compatibility libraries, and whatever would put them on the loader's path.
seen=""
for dir in "$CUDA_DIR/compat" /usr/local/cuda-*/compat; do
  [ -d "$dir" ] || continue
  real=$(cd "$dir" && pwd -P)
  case " $seen " in *" $real "*) continue ;; esac
  seen="$seen $real"
  emit compat_dir "$real"
  for lib in "$dir"/libcuda.so.*.*; do
    [ -f "$lib" ] && emit compat_driver "${lib##*/libcuda.so.}"
  done
  for path in "$dir" "$real"; do
    case ":${LD_LIBRARY_PATH:-}:" in *":$path:"* | *":$path/:"*) emit compat_via "LD_LIBRARY_PATH" ;; esac
    grep -qs "^$path/*\$" /etc/ld.so.conf /etc/ld.so.conf.d/*.conf && emit compat_via "ld.so.conf"
  done
done
[ "${VLLM_ENABLE_CUDA_COMPATIBILITY:-0}" = "1" ] && emit compat_via "VLLM_ENABLE_CUDA_COMPATIBILITY"
echo "compat_checked=1"

if command -v nvidia-smi >/dev/null 2>&1; then
  out=$(nvidia-smi 2>&1)
  emit nvidia_smi_rc "$?"
  printf '%s\n' "$out" | head -n 60 | while IFS= read -r line; do emit nvidia_smi "$line"; done
else
  emit nvidia_smi_rc "127"
fi
exit 0
