#!/usr/bin/env bash
# Builds the Baton image from a `baton` binary, on a machine that may reach no registry.
#
#   deploy/docker/local-images.sh target/release/baton
#
# 1. When an image named gcr.io/distroless/cc-debian12:nonroot (the Dockerfile's runtime base) is
#    absent, builds a stand-in for it from this machine's Debian packages: libc6, libgcc-s1,
#    base-files and, where installed, libstdc++6, libssl3, netbase, tzdata and the CA bundle;
#    /etc/passwd and /etc/group name root and nonroot (65532); /tmp is 1777; /home/nonroot is
#    nonroot's. Imported with `USER 65532` and `WORKDIR /home/nonroot` like the original. No shell.
# 2. When redis:7.2-bookworm is absent, builds a stand-in for it: the same files plus this
#    machine's redis-server and redis-cli in /usr/local/bin with the libraries they link (Debian
#    bookworm's Redis is 7.0: close enough to stand in for 7.2 here), user redis (999) and /data
#    owned by it (`WORKDIR /data`, `VOLUME /data`, `CMD ["redis-server"]`).
#    It has no entrypoint script (and no shell): start it with `redis-server ARGS` as the command,
#    as deploy/compose and deploy/kubernetes do.
# 3. Builds $BATON_IMAGE (default baton:dev) with Dockerfile.prebuilt, with a
#    build context holding only the binary.
#
# Stand-ins carry the label dev.baton.stand-in=true. An image of either name without that label is
# a real one (pulled, or loaded with `docker load`) and is never replaced; a stand-in made by an
# older version of this script is rebuilt. Safe to run again, and from several processes at once
# (they take turns on a lock). Needs Debian with those packages installed, and redis-server.
set -euo pipefail

readonly BASE_IMAGE="gcr.io/distroless/cc-debian12:nonroot"
readonly REDIS_IMAGE="redis:7.2-bookworm"
readonly BATON_IMAGE="${BATON_IMAGE:-baton:dev}"
readonly STAND_IN_LABEL="dev.baton.stand-in"
# Bump when the stand-ins' contents change, so that stand-ins made before are rebuilt.
readonly STAND_IN_RECIPE="1"
readonly LOCK="${BATON_IMAGES_LOCK:-/tmp/baton-local-images.lock}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly here

usage() {
    echo "usage: $0 BINARY   (a baton binary built for linux, e.g. target/release/baton)" >&2
    exit 2
}

[ "$#" -eq 1 ] || usage
binary="$1"
if [ ! -f "$binary" ] || [ ! -x "$binary" ]; then
    echo "local-images.sh: $binary is not an executable file" >&2
    exit 2
fi
binary="$(realpath "$binary")"

for tool in docker dpkg-query tar flock; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "local-images.sh: $tool is missing" >&2
        exit 1
    fi
done

# One caller at a time: two tests asking at once would otherwise both import the same stand-in.
exec 9>>"$LOCK"
if ! flock --wait 600 9; then
    echo "local-images.sh: waited 10 minutes for $LOCK" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Docker 20.10 with a recent CLI and no buildx plugin has no BuildKit client: use the classic
# builder unless the caller chose.
export DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}"

# What to do with an image name: "build" (absent, or a stand-in of an older recipe), "keep-stand-in"
# or "keep-real".
plan_for() {
    local image="$1" label
    if ! docker image inspect "$image" >/dev/null 2>&1; then
        echo build
        return
    fi
    label="$(docker image inspect --format "{{ index .Config.Labels \"$STAND_IN_LABEL.recipe\" }}" "$image" 2>/dev/null || true)"
    if [ "$(docker image inspect --format "{{ index .Config.Labels \"$STAND_IN_LABEL\" }}" "$image" 2>/dev/null || true)" != true ]; then
        echo keep-real
    elif [ "$label" != "$STAND_IN_RECIPE" ]; then
        echo build
    else
        echo keep-stand-in
    fi
}

# On a merged-/usr system (/lib -> usr/lib, ...) the packages still list /lib/...: write every path
# under /usr, and make the same top-level links in the image.
merged_dirs=()
for top in bin sbin lib lib32 lib64 libx32; do
    if [ -L "/$top" ] && [ "$(readlink "/$top")" = "usr/$top" ]; then
        merged_dirs+=("$top")
    fi
done

canonical() {
    local path top
    while IFS= read -r path; do
        for top in "${merged_dirs[@]}"; do
            case "$path" in
                "/$top") continue 2 ;; # the link itself: made below
                "/$top/"*) path="/usr${path}" ;;
            esac
        done
        printf '%s\n' "${path#/}"
    done
}

installed() {
    dpkg-query --show --showformat='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'
}

# The files (and symlinks, not directories) of the installed packages given, without manuals and
# documentation other than copyright notices.
package_files() {
    local package path
    for package in "$@"; do
        if ! installed "$package"; then
            echo "local-images.sh: the Debian package $package is not installed" >&2
            return 1
        fi
        dpkg-query --listfiles "$package"
    done | while IFS= read -r path; do
        case "$path" in
            /*) ;;
            *) continue ;; # "diverted by ..." notes
        esac
        case "$path" in
            /usr/share/doc/*/copyright) ;;
            /usr/share/doc/* | /usr/share/man/* | /usr/share/info/* | /usr/share/lintian/*) continue ;;
        esac
        if [ -L "$path" ] || [ -f "$path" ]; then
            printf '%s\n' "$path"
        fi
    done
}

# The rootfs both stand-ins share, as a tar of host files (owned by root) plus the files written
# to $2 (a folder), which the caller may extend before archiving.
base_rootfs() {
    local list="$1" extra="$2" top
    # What distroless/cc has; the optional ones are left out (with a note) where not installed.
    local packages=(libc6 libgcc-s1 base-files) package
    for package in libstdc++6 libssl3 netbase tzdata; do
        if installed "$package"; then
            packages+=("$package")
        else
            echo "local-images.sh: $package is not installed here; the stand-ins go without it" >&2
        fi
    done
    package_files "${packages[@]}" | canonical >"$list"
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        echo etc/ssl/certs/ca-certificates.crt >>"$list"
    fi
    mkdir -p "$extra/etc" "$extra/tmp" "$extra/root" "$extra/home/nonroot"
    chmod 1777 "$extra/tmp"
    chmod 0700 "$extra/root"
    cat >"$extra/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
    cat >"$extra/etc/group" <<'EOF'
root:x:0:
tty:x:5:
staff:x:50:
nogroup:x:65534:
nonroot:x:65532:
EOF
    printf 'passwd: files\ngroup: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n' \
        >"$extra/etc/nsswitch.conf"
    for top in "${merged_dirs[@]}"; do
        ln -s "usr/$top" "$extra/$top"
    done
}

# tar of the host files in $2, then root-owned $4... from folder $3.
archive() {
    local tarball="$1" list="$2" extra="$3"
    shift 3
    tar --create --file "$tarball" --no-recursion --numeric-owner --owner=0 --group=0 \
        -C / --files-from "$list"
    tar --append --file "$tarball" --no-recursion --numeric-owner --owner=0 --group=0 \
        -C "$extra" "$@"
}

# Appends $4 (a path in folder $3) to tarball $1, owned by uid and gid $2.
append_owned() {
    local tarball="$1" id="$2" extra="$3" path="$4"
    tar --append --file "$tarball" --no-recursion --numeric-owner --owner="$id" --group="$id" \
        -C "$extra" "$path"
}

stand_in_labels() {
    printf '%s\n' \
        --change "LABEL $STAND_IN_LABEL=true" \
        --change "LABEL $STAND_IN_LABEL.recipe=$STAND_IN_RECIPE"
}

build_base() {
    local dir="$work/base"
    mkdir -p "$dir/extra"
    base_rootfs "$dir/files" "$dir/extra"
    archive "$dir/rootfs.tar" "$dir/files" "$dir/extra" \
        etc/passwd etc/group etc/nsswitch.conf tmp root home "${merged_dirs[@]}"
    append_owned "$dir/rootfs.tar" 65532 "$dir/extra" home/nonroot
    local labels=()
    mapfile -t labels < <(stand_in_labels)
    docker import "${labels[@]}" \
        --change 'USER 65532' \
        --change 'WORKDIR /home/nonroot' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
        "$dir/rootfs.tar" "$BASE_IMAGE" >/dev/null
}

build_redis() {
    local dir="$work/redis" server cli library
    server="$(command -v redis-server || true)"
    cli="$(command -v redis-cli || true)"
    if [ -z "$server" ] || [ -z "$cli" ]; then
        echo "local-images.sh: redis-server and redis-cli are needed for the $REDIS_IMAGE stand-in (apt-get install redis-server)" >&2
        return 1
    fi
    mkdir -p "$dir/extra/usr/local/bin" "$dir/extra/data"
    base_rootfs "$dir/files" "$dir/extra"
    echo 'redis:x:999:999::/data:/sbin/nologin' >>"$dir/extra/etc/passwd"
    echo 'redis:x:999:' >>"$dir/extra/etc/group"
    # Debian's redis-server is a link to redis-check-rdb (one binary that looks at its name).
    cp -L "$server" "$dir/extra/usr/local/bin/redis-server"
    cp -L "$cli" "$dir/extra/usr/local/bin/redis-cli"
    # Each library as ldd names it (a soname link, usually) and the file it points to.
    ldd "$server" "$cli" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $1 !~ /:$/ { print $1 }' |
        sort -u | while IFS= read -r library; do
            printf '%s\n' "$library"
            realpath "$library"
        done | canonical >>"$dir/files"
    sort -u -o "$dir/files" "$dir/files"
    archive "$dir/rootfs.tar" "$dir/files" "$dir/extra" \
        etc/passwd etc/group etc/nsswitch.conf tmp root home "${merged_dirs[@]}" \
        usr/local/bin/redis-server usr/local/bin/redis-cli
    append_owned "$dir/rootfs.tar" 65532 "$dir/extra" home/nonroot
    append_owned "$dir/rootfs.tar" 999 "$dir/extra" data
    local labels=()
    mapfile -t labels < <(stand_in_labels)
    docker import "${labels[@]}" \
        --change 'WORKDIR /data' \
        --change 'VOLUME /data' \
        --change 'EXPOSE 6379' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["redis-server"]' \
        "$dir/rootfs.tar" "$REDIS_IMAGE" >/dev/null
}

ensure() {
    local image="$1" builder="$2"
    case "$(plan_for "$image")" in
        keep-real) echo "kept $image: a real image, not a stand-in" ;;
        keep-stand-in) echo "kept $image: the stand-in made before" ;;
        build)
            "$builder"
            echo "built $image: a stand-in from this host's Debian packages ($STAND_IN_LABEL=true)"
            ;;
    esac
}

ensure "$BASE_IMAGE" build_base
ensure "$REDIS_IMAGE" build_redis

# The binary alone in a build context: the repository's would send gigabytes of target/.
mkdir "$work/context"
ln "$binary" "$work/context/baton" 2>/dev/null || cp "$binary" "$work/context/baton"
version="$("$binary" --version | awk '{ print $NF }')"
revision="$(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)"
previous="$(docker image inspect --format '{{.Id}}' "$BATON_IMAGE" 2>/dev/null || true)"
# The labels of a stand-in base would otherwise be inherited and make this image look like one.
if ! docker build --quiet \
    --file "$here/Dockerfile.prebuilt" \
    --build-arg "VERSION=$version" \
    --build-arg "REVISION=$revision" \
    --label "$STAND_IN_LABEL=false" \
    --tag "$BATON_IMAGE" \
    "$work/context" >/dev/null 2>"$work/build.log"; then
    cat "$work/build.log" >&2
    echo "local-images.sh: could not build $BATON_IMAGE" >&2
    exit 1
fi
# The image this one replaced, when nothing else uses it: each new binary would leave 100 MB behind.
current="$(docker image inspect --format '{{.Id}}' "$BATON_IMAGE")"
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    docker image rm "$previous" >/dev/null 2>&1 || true
fi
echo "built $BATON_IMAGE: baton $version ($revision) from $binary, with $here/Dockerfile.prebuilt"
