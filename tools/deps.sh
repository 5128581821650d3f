# Sourced by quickstart.sh and test.sh: install the Debian packages etp needs,
# and only those that are missing (so a machine that has them all, or has no
# network, is left alone).
# A package counts as there when dpkg has it, or (CMocka) when a prefix on
# CMAKE_PREFIX_PATH carries it, as on GPU machines given an unpacked copy.
etp_have() {
    case "$1" in  # a tool on PATH will do, however it was installed
        cmake|make|gcc|pkg-config) command -v "$1" >/dev/null 2>&1 && return 0 ;;
        openmpi-bin) command -v mpirun >/dev/null 2>&1 && return 0 ;;
        libopenmpi-dev) command -v mpicc >/dev/null 2>&1 && return 0 ;;
    esac
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed" && return 0
    if [ "$1" = libcmocka-dev ]; then
        local d
        IFS=: read -ra dirs <<< "${CMAKE_PREFIX_PATH:-}"
        for d in "${dirs[@]}"; do
            ls "$d"/lib/*/cmake/cmocka/cmocka-config.cmake >/dev/null 2>&1 && return 0
        done
    fi
    return 1
}

etp_install_missing() {
    local want=(cmake make gcc pkg-config openmpi-bin libopenmpi-dev "$@") missing=() p
    for p in "${want[@]}"; do
        etp_have "$p" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "etp: installing missing packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    if ! { timeout 300 $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
        # No network (a GPU machine with carried dependencies, say): go on,
        # and let CMake say precisely what it cannot find.
        echo "etp: could not install ${missing[*]}; continuing with what is here" >&2
    fi
}

# mpirun as root needs these; containers need the vader setting.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

etp_gpu_count() {
    command -v nvidia-smi >/dev/null 2>&1 || { echo 0; return; }
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
}
