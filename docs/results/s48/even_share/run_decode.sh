#!/bin/bash
cd "$(dirname "$0")"
D=$OUT/decode.txt
bin/nibble_new synth --out /tmp/l8b --tokenizer-from tok --force > $OUT/synth.txt 2>&1
bin/nibble_new -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force >> $OUT/synth.txt 2>&1
rm -rf /tmp/l8b
for r in 1 2; do for b in new gemv; do
  echo "== $b run $r" >> $D
  bin/nibble_$b run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null | grep -E "decode|prefill" >> $D
done; done
cat $D
