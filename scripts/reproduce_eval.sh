#!/usr/bin/env bash
# Rebuild the evaluation tables (results/eval, margin, study, refinement, sweep-kb, the table classifier's)
# and the shipped adapter's calibration from the shared data sets.
#   bash scripts/reproduce_eval.sh [SHARED_DATA]      (default ../shared/data)
# Steps (each resumable: converted sets, the index and the LLM reply cache are kept in runs/):
#   1. convert HotpotQA (dev700 + train100, one set), NQ (9 distractors, seed 0) and TAT-QA into runs/data/;
#      then what is chosen on validation questions: Algorithm 1's margin (calibration.json beside the
#      config's adapter, read by the policy `canopy margin=auto`) and the table classifier
#      (results/bench/table_classifier_validation.md; its test report beside it);
#   2. given setting: every test question of each set, shipped / no_projection and the matched-budget
#      baselines (random / flat_matched / random_total), reader skipped (answer recall is
#      reader-free): the shipped policy (results/eval/given-hybrid), and Algorithm 1 at the paper's
#      margin 0 (results/eval/given) and at the adapter's calibrated margin (results/eval/given-calibrated);
#   3. Algorithm 1's margin curve on 100 test questions per set, random and flat_matched at each
#      point's budget (results/margin; nothing is chosen on test);
#   4. open setting, shipped configuration: one index of the three corpora (runs/eval-index/all),
#      60 test questions per set, the SmolLM2 critic's follow-up rounds;
#   5. canopy report results/eval (results.md, pareto.md and the PNGs);
#   6. the refinement study (results/study: policies chosen on validation, reported on test); its pick is
#      written into $CONFIG's refinement.policy (tests/test_published.py checks that they agree);
#   7. refinement on gold items, f0 and f_theta, on validation and test (results/refinement), and
#      with a cross-encoder scorer the fused scorer (results/refinement/fusion);
#   8. the k x B sweep of the shipped configuration (results/sweep-kb).
# Steps 6 and 7 compare the cross-encoder scorer at CROSS (default runs/train/minilm-cross/scorer,
# trained first by `canopy train --scorer cross` if missing, half an hour or more); CROSS= (empty)
# leaves its rows out.
# Every run JSON's spec records the split, seed, n, candidate counts, config hash and adapter id.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${1:-../shared/data}
CONFIG=${CONFIG:-configs/cpu.yaml}
METHODS=shipped,no_projection,random,flat_matched,random_total
OPEN_N=${OPEN_N:-60}
CROSS=${CROSS-runs/train/minilm-cross/scorer}
C=.venv/bin/canopy
PY=.venv/bin/python

$C data convert --format hotpotqa "$SHARED/hotpotqa/hotpotqa_distractor_dev700.jsonl" \
    "$SHARED/hotpotqa/hotpotqa_train100.json" runs/data/hotpotqa
$C data convert --format nq --n-distractors 9 --seed 0 "$SHARED/nq/nq_open_oracle_1655.jsonl.gz" runs/data/nq
# NQ with hard distractors: the same split's passages nearest to the question (BM25 and f0), none holding an answer
$C data convert --format nq --distractors hard --config "$CONFIG" --n-distractors 9 --seed 0 \
    "$SHARED/nq/nq_open_oracle_1655.jsonl.gz" runs/data/nq_hard
$C data convert --format tatqa "$SHARED/tatqa/tatqa_dev.json" runs/data/tatqa

$C calibrate --config "$CONFIG" --target-loss 0.01 --shared-data "$SHARED" --work-dir runs/data
tc=(env CANOPY_SHARED_DATA="$SHARED" $PY benchmarks/table_classifier.py --config "$CONFIG" --llm-cache runs/llm.sqlite)
"${tc[@]}" --split validation --out results/bench/table_classifier_validation.md
"${tc[@]}" --split test --out results/bench/table_classifier.md

for set in hotpotqa nq tatqa; do
    given=($C eval --config "$CONFIG" --questions runs/data/$set/questions.jsonl --corpus runs/data/$set/corpus.jsonl
           --dataset $set --split test --no-reader --llm-cache runs/llm.sqlite --method $METHODS)
    "${given[@]}" --out results/eval/given-hybrid/$set
    "${given[@]}" --policy "canopy margin=0" --out results/eval/given/$set
    "${given[@]}" --policy "canopy margin=auto" --out results/eval/given-calibrated/$set
done

$C calibrate --config "$CONFIG" --split test --n 100 --grid 0,0.02,0.03,0.05 --matched random,flat_matched \
    --shared-data "$SHARED" --work-dir runs/data --out results/margin

mkdir -p runs/eval-corpus
cat runs/data/{hotpotqa,nq,tatqa}/corpus.jsonl > runs/eval-corpus/all.jsonl
$C index --config "$CONFIG" --corpus runs/eval-corpus/all.jsonl --out runs/eval-index/all --overwrite
mkdir -p results/eval/open
cp runs/eval-index/all/summary.json results/eval/open/index_summary.json  # what the open runs retrieve from
for set in hotpotqa nq tatqa; do
    $C eval --config "$CONFIG" --questions runs/data/$set/questions.jsonl --setting open --index runs/eval-index/all \
        --dataset $set --split test --n "$OPEN_N" --no-reader --llm-cache runs/llm.sqlite --method $METHODS \
        --out results/eval/open/$set
done

$C report results/eval

if [ -n "$CROSS" ] && [ ! -f "$CROSS/scorer.safetensors" ]; then
    $C train --config "$CONFIG" --scorer cross --address local --shared-data "$SHARED" --out "$CROSS"
fi
$PY -m canopy_ray.eval.study --config "$CONFIG" ${CROSS:+--cross "$CROSS"} --write-config "$CONFIG"

for split in validation test; do
    $C eval-refinement --config "$CONFIG" --split $split --shared-data "$SHARED" --out results/refinement/$split
    if [ -n "$CROSS" ]; then
        $C eval-refinement --config "$CONFIG" --split $split --shared-data "$SHARED" --cross "$CROSS" \
            --out results/refinement/$split-cross
    fi
done
if [ -n "$CROSS" ]; then $PY -m canopy_ray.eval.fusion --config "$CONFIG" --cross "$CROSS" --shared-data "$SHARED"; fi

$C sweep --spec configs/sweep-kb.yaml --out results/sweep-kb
$C report results/sweep-kb
