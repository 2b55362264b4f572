#!/bin/sh
# Prints the pip arguments that install torch 2.13.0 in the build this machine can use, and says on stderr which
# build it chose and why. A machine with an NVIDIA GPU gets PyPI's CUDA build; every other machine gets the CPU build
# (PyPI's plain torch==2.13.0 is the CUDA build: 2.7 GB of NVIDIA libraries a CPU never loads). The CPU build comes
# from a local wheel when one lies in a folder pip is told to look in ($TORCH_WHEELS, else /opt/wheels, as on this
# project's development machines), else from PyTorch's own CPU wheel index.
# Usage: torch_build.sh [auto|cpu|cuda]
set -eu
version=2.13.0
choice=${1:-auto}
if [ "$choice" = auto ]; then
    if [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1; then
        choice=cuda; why="an NVIDIA GPU is present"
    else
        choice=cpu; why="no NVIDIA GPU found: no /proc/driver/nvidia, no working nvidia-smi"
    fi
else
    why="TORCH_BUILD=$choice"
fi
case "$choice" in
cuda)
    echo "torch: CUDA build $version from PyPI ($why)" >&2
    echo "torch==$version"
    ;;
cpu)
    wheels=${TORCH_WHEELS:-/opt/wheels}
    for wheel in "$wheels"/torch-$version+cpu-cp311-*.whl; do
        if [ -f "$wheel" ]; then
            echo "torch: CPU build $version from the local wheel $wheel ($why)" >&2
            echo "$wheel"
            exit 0
        fi
    done
    echo "torch: CPU build $version from PyTorch's CPU wheel index ($why)" >&2
    echo "torch==$version+cpu --extra-index-url https://download.pytorch.org/whl/cpu"
    ;;
*)
    echo "torch_build.sh: TORCH_BUILD must be auto, cpu or cuda, not '$choice'" >&2
    exit 2
    ;;
esac
