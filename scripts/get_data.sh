#!/bin/sh
# Gets the files the README's examples need, Tiny Shakespeare and GPT-2's BPE files, into the
# repository's data/ directory (where `--tokenizer gpt2` finds them without --vocab), each checked
# against its SHA-256 before it is put in place. Downloads from the public sources, or copies from
# a directory (--from: offline machines, tests).
#
#   scripts/get_data.sh                  # download into data/
#   scripts/get_data.sh --from DIR       # copy from DIR (DIR/tinyshakespeare.txt, DIR/gpt2/...)
#   scripts/get_data.sh --dest DIR       # put them in DIR instead of data/
#
# Writes DEST/tinyshakespeare.txt, DEST/gpt2/encoder.json and DEST/gpt2/vocab.bpe. A file already
# there with the right hash is kept; one with another hash is replaced. Nothing reaches its final
# name unless its hash matches. Needs curl (downloads only) and sha256sum.
set -eu

usage() {
    cat <<'EOF'
usage: scripts/get_data.sh [--from DIR] [--dest DIR]
  --from DIR   copy the files from DIR instead of downloading them: DIR/tinyshakespeare.txt and
               DIR/gpt2/encoder.json, DIR/gpt2/vocab.bpe (or DIR/encoder.json, DIR/vocab.bpe)
  --dest DIR   where to put them (default: data/ in the repository, where tessera looks for GPT-2's
               files when no --vocab is given)
EOF
}

die() {
    echo "get_data.sh: $*" >&2
    exit 1
}

repo=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
from=""
dest="$repo/data"
while [ $# -gt 0 ]; do
    case "$1" in
        --from) [ $# -ge 2 ] || die "--from needs a directory"; from=$2; shift 2 ;;
        --from=*) from=${1#--from=}; shift ;;
        --dest) [ $# -ge 2 ] || die "--dest needs a directory"; dest=$2; shift 2 ;;
        --dest=*) dest=${1#--dest=}; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[ -z "$from" ] || [ -d "$from" ] || die "--from $from is not a directory"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum is needed (Debian: coreutils)"

# The sources. Tiny Shakespeare: karpathy/char-rnn at a fixed commit (the file nanoGPT and llm.c
# download). GPT-2: OpenAI's original files; their hashes are the ones openai/tiktoken pins.
shakespeare_url="https://raw.githubusercontent.com/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt"
gpt2_url="https://openaipublic.blob.core.windows.net/gpt-2/encodings/main"

sha256_of() {
    sha256sum < "$1" | cut -d ' ' -f 1
}

# get NAME SHA256 URL: DEST/NAME from --from (DIR/NAME, or DIR/basename(NAME)) or from URL.
get() {
    name=$1 want=$2 url=$3
    target="$dest/$name"
    if [ -f "$target" ] && [ "$(sha256_of "$target")" = "$want" ]; then
        echo "  $target: already there (sha256 ok)"
        return 0
    fi
    mkdir -p "$(dirname -- "$target")"
    tmp="$target.part.$$"
    trap 'rm -f "$tmp"' EXIT INT TERM
    if [ -n "$from" ]; then
        src="$from/$name"
        [ -f "$src" ] || src="$from/$(basename -- "$name")"
        [ -f "$src" ] || die "$from has no $name (nor $(basename -- "$name"))"
        cp -- "$src" "$tmp"
    else
        src=$url
        command -v curl >/dev/null 2>&1 || die "curl is needed to download (or give --from DIR)"
        curl --fail --location --silent --show-error --retry 3 --output "$tmp" -- "$url" ||
            die "cannot download $url (offline? give --from DIR with the files)"
    fi
    got=$(sha256_of "$tmp")
    if [ "$got" != "$want" ]; then
        rm -f "$tmp"
        die "$src has sha256 $got, expected $want: not the file the examples need; $target left as it was"
    fi
    mv -f -- "$tmp" "$target"
    trap - EXIT INT TERM
    echo "  $target: from $src (sha256 ok)"
}

echo "getting the example data into $dest"
get tinyshakespeare.txt 86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed "$shakespeare_url"
get gpt2/encoder.json 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 "$gpt2_url/encoder.json"
get gpt2/vocab.bpe 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5 "$gpt2_url/vocab.bpe"
echo "done. GPT-2's files are found in $dest/gpt2 by \`tessera prepare --tokenizer gpt2\` without --vocab$(
    [ "$dest" = "$repo/data" ] || printf ' when TESSERA_DATA_DIR=%s' "$dest")."
