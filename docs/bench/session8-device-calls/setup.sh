# sourced on the GPU machine from the repo root: wheels, gsplat's extension, import roots
source .whl/gpu-prelude.sh || return 1
mkdir -p /tmp/pp/splat_train /tmp/pphead/splat_train
for d in trainer kernels configs scripts; do
  ln -sfn $PWD/$d /tmp/pp/splat_train/$d; ln -sfn $PWD/.gpu/head/$d /tmp/pphead/splat_train/$d
done
touch /tmp/pp/splat_train/__init__.py /tmp/pphead/splat_train/__init__.py
export BASEPP=$PYTHONPATH
new() { PYTHONPATH=/tmp/pp:$BASEPP python3 -m splat_train.trainer.cli "$@"; }
head_() { PYTHONPATH=/tmp/pphead:$BASEPP python3 -m splat_train.trainer.cli "$@"; }
export SPLAT_TRAIN_CACHE=/tmp/cache
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
