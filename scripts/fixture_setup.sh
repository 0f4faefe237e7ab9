# Sourced by the yardstick table scripts (formats_table.sh, methods_table.sh, gptq_table.sh):
# the fixture's model, calibration and evaluation split, the same for every
# table. Needs $which (stories|qwen3) and $tag (for the scratch dir name);
# sets here, shared, nibble, work, model, calib, int4, corpus, ctx, chunks.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shared=${NIBBLE_SHARED:-$here/../shared}
nibble=${NIBBLE:-$here/build/bin/nibble}
work=${WORK:-$(mktemp -d "/tmp/nibble-$tag.XXXXXX")}
mkdir -p "$work"
corp=$shared/data/corpora
case $which in
  stories)
    model=$shared/models/stories260K
    head -c 96207 "$corp/tinystories-valid-sample.txt" > "$work/calib.txt"   # SOURCES.md split
    tail -c +96208 "$corp/tinystories-valid-sample.txt" > "$work/eval.txt"
    calib="--calib $work/calib.txt --calib-samples 128 --calib-len 512"
    int4=int4_g64_asym
    corpus="tinystories=$work/eval.txt"; ctx=256; chunks=40 ;;
  qwen3)
    model=$shared/models/qwen3-26M-linux
    cp "$corp/linux-calib.txt" "$work/calib.txt"
    calib="--calib $work/calib.txt --calib-samples 64 --calib-len 512"
    int4=int4_g128_asym
    corpus="linux=$corp/linux-eval.txt"; ctx=512; chunks=40 ;;
  *) echo "unknown fixture $which" >&2; exit 2 ;;
esac
