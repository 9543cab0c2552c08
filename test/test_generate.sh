#!/usr/bin/env bash
# Your own text, trained on and generated from, on the GPU:
#   own text     data/prepare_text.py turns the project's docs/*.md (text that is not Shakespeare)
#                into validation and training shards; train_gpt_fp32 trains a small GPT-2 (C=256, 4
#                layers) on the shards through a glob, finding the validation shards beside them by
#                itself (no -j): its training loss must fall by more than 1 over 60 steps
#   greedy       generate_gpt_fp32 with temperature 0 from that run's folder gives exactly the tokens
#                gpt_reference.py generate gives for the same checkpoint and prompt (fp32, TF32 off);
#                also from an llm.c model file of the same weights (gpt_reference.py export --format llmc)
#   sampled      generate_gpt_fp32 with temperature 0.9, top-k 50 and a seed gives exactly the tokens
#                gpt_reference.py generate gives with the same seed (the sampler is the same, draw for
#                draw); at least 12 of the 48 are distinct, so the check compares real choices (greedy
#                decoding of so small a model mostly repeats one token)
#   nucleus      generate_gpt_fp32 with top-p 0.9, the prompt from a file and a stop at <|endoftext|>
#                gives exactly gpt_reference.py generate's tokens with the same settings and seed
#   sampling     generate_gpt_bf16 with the same seed twice: the same tokens; another seed: others
#   hellaswag    made-up HellaSwag examples (sentences of the docs, endings from other sentences):
#                eval_gpt_fp32 and gpt_reference.py eval (fp32, TF32 off) score every completion within
#                1e-4 relative and choose the same ending wherever the two best differ by more than
#                that (test/hellaswag_compare.py); train_gpt -he logs the score (main.log's s:N eval:ACC,
#                metrics.csv's columns) at each -v and at the end
# Without a GPU every check is reported as skipped. Ends with `N passed, N failed, N skipped`.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
checks=("own text: prepare_text.py" "own text: train_gpt on the shards" "greedy: CUDA = PyTorch" "greedy from an llm.c file"
        "sampled: CUDA = PyTorch" "nucleus: CUDA = PyTorch" "sampling: seeded" "hellaswag: CUDA = PyTorch"
        "hellaswag: train_gpt -he")
passed=0 failed=0 skipped=0
if ! nvidia-smi -L >/dev/null 2>&1; then
    for c in "${checks[@]}"; do echo "$c: skipped (no CUDA device)"; skipped=$((skipped + 1)); done
    echo "$passed passed, $failed failed, $skipped skipped"
    exit 0
fi
report() {
    if [[ $2 -eq 1 ]]; then passed=$((passed + 1)); printf '  %-62s ok    %s\n' "$1" "$3"
    else failed=$((failed + 1)); printf '  %-62s FAIL  %s\n' "$1" "$3"; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ids_of() { sed -n 's/^tokens: //p' "$1"; }

# ---- own text: shards of the docs, small shards so that there are several
"$PYTHON" data/prepare_text.py docs --glob '*.md' --out-dir "$tmp/data" --name docs --val-tokens 4096 --shard-tokens 20000 \
    --tokenizer-out "$tmp/tok.bin" >"$tmp/prep.log" 2>&1
rc=$?
shards=$(ls "$tmp"/data/docs_train_*.bin 2>/dev/null | wc -l)
report "prepare_text.py: docs/*.md into shards" "$([[ $rc -eq 0 && $shards -ge 2 && -e $tmp/data/docs_val_000000.bin ]] && echo 1 || echo 0)" \
    "exit code $rc, $shards training shards; $(tail -n 1 "$tmp/prep.log")"
"$PYTHON" gpt_reference.py init --model L=4,NH=4,C=256,V=50257,maxT=256 --seed 3 --out "$tmp/init.ckpt" >/dev/null
timeout 300 ./train_gpt_fp32 -e "$tmp/init.ckpt" -i "$tmp/data/docs_train_*.bin" -z "$tmp/tok.bin" -b 8 -t 128 -x 60 -l 1e-3 -u 10 \
    -v 30 -m 2 -s 0 -o "$tmp/run" >"$tmp/train.log" 2>&1
rc=$?
first=$(sed -nE 's/^step +1\/60 \| loss ([^ ]+).*/\1/p' "$tmp/train.log")
last=$(sed -nE 's/^step +60\/60 \| loss ([^ ]+).*/\1/p' "$tmp/train.log")
vals=$(grep -c '^step .* | val loss' "$tmp/train.log")
ok=$(awk -v a="${first:-0}" -v b="${last:-99}" 'BEGIN { print (a - b > 1.0) ? 1 : 0 }')
report "train_gpt_fp32 on the shards (glob -i, validation found beside)" "$([[ $rc -eq 0 && $ok -eq 1 && $vals -ge 2 ]] && echo 1 || echo 0)" \
    "exit code $rc, loss $first -> $last, $vals validations"

# ---- greedy: ours (fp32) against PyTorch, same checkpoint and prompt
model=$tmp/run/model_00000060.bin
prompt="The LayerNorm"
timeout 120 ./generate_gpt_fp32 -e "$tmp/run" -z "$tmp/tok.bin" -p "$prompt" -g 48 -tp 0 -ids 1 >"$tmp/ours.txt" 2>"$tmp/ours.err"
rc1=$?
GPT_MIRROR=${GPT_MIRROR:-} timeout 300 "$PYTHON" gpt_reference.py generate -e "$model" --prompt "$prompt" -n 48 --temperature 0 \
    --device cuda >"$tmp/torch.txt" 2>"$tmp/torch.err"
rc2=$?
ours=$(ids_of "$tmp/ours.txt") theirs=$(ids_of "$tmp/torch.txt")
report "greedy, 48 tokens: generate_gpt_fp32 = gpt_reference.py" "$([[ $rc1 -eq 0 && $rc2 -eq 0 && -n $ours && $ours == "$theirs" ]] && echo 1 || echo 0)" \
    "exit codes $rc1, $rc2; ours: ${ours:0:60}...; PyTorch: ${theirs:0:60}...; $(tail -n 1 "$tmp/ours.err")"
"$PYTHON" gpt_reference.py export "$model" --format llmc --dtype fp32 --out "$tmp/llmc.bin" >/dev/null 2>&1
timeout 120 ./generate_gpt_fp32 -e "$tmp/llmc.bin" -z "$tmp/tok.bin" -p "$prompt" -g 48 -tp 0 -ids 1 >"$tmp/llmc.txt" 2>&1
report "greedy from the llm.c model file of the same weights" "$([[ -n $ours && $(ids_of "$tmp/llmc.txt") == "$ours" ]] && echo 1 || echo 0)" ""

# ---- sampled: ours (fp32) against PyTorch, same seed
timeout 120 ./generate_gpt_fp32 -e "$tmp/run" -z "$tmp/tok.bin" -p "$prompt" -g 48 -tp 0.9 -k 50 -sd 5 -ids 1 \
    >"$tmp/ours_s.txt" 2>"$tmp/ours_s.err"
rc1=$?
GPT_MIRROR=${GPT_MIRROR:-} timeout 300 "$PYTHON" gpt_reference.py generate -e "$model" --prompt "$prompt" -n 48 --temperature 0.9 \
    --top-k 50 --seed 5 --device cuda >"$tmp/torch_s.txt" 2>"$tmp/torch_s.err"
rc2=$?
ours=$(ids_of "$tmp/ours_s.txt") theirs=$(ids_of "$tmp/torch_s.txt")
distinct=$(tr ' ' '\n' <<<"$ours" | grep . | sort -u | wc -l)
report "sampled, 48 tokens, seed 5: generate_gpt_fp32 = gpt_reference.py" \
    "$([[ $rc1 -eq 0 && $rc2 -eq 0 && -n $ours && $ours == "$theirs" && $distinct -ge 12 ]] && echo 1 || echo 0)" \
    "exit codes $rc1, $rc2; $distinct distinct; ours: ${ours:0:60}...; PyTorch: ${theirs:0:60}..."

# ---- nucleus, the prompt from a file, a stop at <|endoftext|>: ours (fp32) against PyTorch
printf '%s' "$prompt" >"$tmp/prompt.txt"
timeout 120 ./generate_gpt_fp32 -e "$tmp/run" -z "$tmp/tok.bin" -pi "$tmp/prompt.txt" -g 48 -tp 1.1 -pp 0.9 -eot 1 -sd 7 -ids 1 \
    >"$tmp/ours_p.txt" 2>"$tmp/ours_p.err"
rc1=$?
GPT_MIRROR=${GPT_MIRROR:-} timeout 300 "$PYTHON" gpt_reference.py generate -e "$model" --prompt-file "$tmp/prompt.txt" -n 48 \
    --temperature 1.1 --top-p 0.9 --stop-at-eot 1 --seed 7 --device cuda >"$tmp/torch_p.txt" 2>"$tmp/torch_p.err"
rc2=$?
ours=$(ids_of "$tmp/ours_p.txt") theirs=$(ids_of "$tmp/torch_p.txt")
report "nucleus 0.9, prompt file, stop at eot: generate_gpt_fp32 = gpt_reference.py" \
    "$([[ $rc1 -eq 0 && $rc2 -eq 0 && -n $ours && $ours == "$theirs" && " $ours " != *" 50256 "* ]] && echo 1 || echo 0)" \
    "exit codes $rc1, $rc2; ours: ${ours:0:60}...; PyTorch: ${theirs:0:60}...; $(tail -n 1 "$tmp/ours_p.err")"

# ---- seeded sampling
n=0
for s in 5 5 6; do
    n=$((n + 1))
    timeout 120 ./generate_gpt_bf16 -e "$tmp/run" -z "$tmp/tok.bin" -p "$prompt" -g 32 -tp 0.9 -k 50 -sd $s -ids 1 >"$tmp/s$s.$n.txt" 2>/dev/null
done
mapfile -t runs < <(for f in "$tmp"/s5.*.txt; do ids_of "$f"; done)
other=$(for f in "$tmp"/s6.*.txt; do ids_of "$f"; done)
report "sampling: seed 5 twice gives the same tokens, seed 6 others" \
    "$([[ ${#runs[@]} -eq 2 && -n ${runs[0]} && ${runs[0]} == "${runs[1]}" && -n $other && $other != "${runs[0]}" ]] && echo 1 || echo 0)" \
    "${runs[0]:0:50}..."

# ---- HellaSwag: made-up examples from the docs' sentences, scored by CUDA (fp32) and PyTorch
"$PYTHON" test/hellaswag_compare.py make "$tmp/hs.jsonl" 300
GPT_MIRROR=${GPT_MIRROR:-} "$PYTHON" data/prepare_hellaswag.py "$tmp/hs.jsonl" --out "$tmp/hs.bin" >"$tmp/hs_prep.log" 2>&1
timeout 300 ./eval_gpt_fp32 -e "$model" -he "$tmp/hs.bin" -b 16 -t 256 -scores "$tmp/hs_cuda.tsv" >"$tmp/hs_cuda.txt" 2>"$tmp/hs_cuda.err"
rc1=$?
timeout 600 "$PYTHON" gpt_reference.py eval -e "$model" --hellaswag "$tmp/hs.bin" --scores "$tmp/hs_torch.tsv" --device cuda \
    >"$tmp/hs_torch.txt" 2>"$tmp/hs_torch.err"
rc2=$?
verdict=$("$PYTHON" test/hellaswag_compare.py compare "$tmp/hs_cuda.tsv" "$tmp/hs_torch.tsv" 300 2>&1)
report "hellaswag, 300 made-up examples: eval_gpt_fp32 = gpt_reference.py eval" \
    "$([[ $rc1 -eq 0 && $rc2 -eq 0 && $verdict == agree:* ]] && echo 1 || echo 0)" \
    "exit codes $rc1, $rc2; $verdict; CUDA: $(head -n 1 "$tmp/hs_cuda.txt"); $(tail -n 1 "$tmp/hs_cuda.err")"
timeout 300 ./train_gpt_bf16 -e "$model" -i "$tmp/data/docs_train_*.bin" -z "$tmp/tok.bin" -b 8 -t 256 -x 4 -v 2 -m 1 -s 0 \
    -he "$tmp/hs.bin" -o "$tmp/run_he" >"$tmp/he.log" 2>&1
rc=$?
evals=$(grep -c '^s:[0-9]* eval:' "$tmp/run_he/main.log" 2>/dev/null)
header=$(head -n 1 "$tmp/run_he/metrics.csv" 2>/dev/null)
rows=$(grep -cE '^[0-9]+,,,,,,,[0-9.]+,[0-9.]+$' "$tmp/run_he/metrics.csv" 2>/dev/null)
report "train_gpt -he: the score at steps 0, 2, 4 in main.log and metrics.csv" \
    "$([[ $rc -eq 0 && $evals -eq 3 && $rows -eq 3 && $header == *hellaswag_acc_norm,hellaswag_acc ]] && echo 1 || echo 0)" \
    "exit code $rc, $evals eval lines, $rows metrics rows; $(grep -m1 'hellaswag acc_norm' "$tmp/he.log"); $(tail -n 1 "$tmp/he.log")"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
