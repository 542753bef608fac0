#!/usr/bin/env bash
# CPU side, once per checkout: stage the CuTe stack (.gpu/a, .gpu/b), cuDNN-frontend (.gpu/c) and
# FastVideo's prebuilt x86_64 cp312 wheel from its sdist (.gpu/d), and copy these scripts to .gpu/e.
# Then the device calls of README.md in this folder.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
EXTRA="nvidia-cudnn-frontend==1.32.0" ../shared/gpu/stage-wheels
mkdir -p .gpu/d .gpu/e /tmp/fvk
url=$(curl -s https://pypi.org/simple/fastvideo-kernel/ | grep -o 'https://[^"#]*fastvideo_kernel-0.3.5.tar.gz' | head -1)
[ -f /tmp/fvk/fvk.tar.gz ] || curl -s -o /tmp/fvk/fvk.tar.gz "$url"
whl=$(tar tzf /tmp/fvk/fvk.tar.gz | grep 'dist/.*x86_64.*\.whl$')
tar xzf /tmp/fvk/fvk.tar.gz -C /tmp/fvk "$whl" && cp "/tmp/fvk/$whl" .gpu/d/
cp benchmarks/device/*.sh .gpu/e/
git rev-parse HEAD > .gpu/e/COMMIT
du -sh .gpu/a .gpu/b .gpu/c .gpu/d
