# Device side, sourced by the other scripts: the CuTe stack (once per machine, from .gpu/b), cuDNN-frontend
# (/tmp/fvc/c, parked by call 1), FastVideo (.gpu/d when carried; its bundled libcuda replaced by a link to
# the driver's), this checkout in editable mode; FVC_COMMIT for the results' git_commit field.
set -e
[ -f /tmp/fvc/env.sh ] || bash .gpu/b/install.sh
. /tmp/fvc/env.sh
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FVC_COMMIT=$(cat .gpu/e/COMMIT)
if [ -d /tmp/fvc/c ] && [ ! -d /tmp/fvc/site/cudnn ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/fvc/site /tmp/fvc/c/*.whl
fi
if ls .gpu/d/*.whl >/dev/null 2>&1 && [ ! -d /tmp/fvc/site/fastvideo_kernel ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/fvc/site .gpu/d/*.whl
  sys=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
  for f in /tmp/fvc/site/fastvideo_kernel.libs/libcuda-*.so*; do rm -f "$f"; ln -s "$sys" "$f"; done
  echo "fastvideo-kernel installed, libcuda -> $sys"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || python3 -m pip install -q --no-deps --no-build-isolation -e .
python3 -c "import torch, fastvideo_cute; print('ok', torch.cuda.get_device_name(), fastvideo_cute.__file__)"
set +e
