# Sourced by .ci/run and scripts/regenerate-ptx.sh: installs NVRTC from the pinned
# nvidia-cuda-nvrtc wheel into target/nvrtc-venv (once) and puts it on LD_LIBRARY_PATH, so
# mdl-gpu's kernels can be compiled without CUDA or a GPU.
venv=target/nvrtc-venv
if [ ! -e "$venv/.installed" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    source scripts/ticking.sh
    ticking "installing NVRTC" "$venv/bin/pip" install -q "nvidia-cuda-nvrtc-cu12==12.8.93"
    touch "$venv/.installed"
fi
nvrtc=$(echo "$PWD/$venv"/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib)
export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
