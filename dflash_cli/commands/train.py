"""Train a DFlash drafter for a target, in resumable stages that share one work folder:
prompts -> responses (the target answers) -> features (stored target hidden states) ->
train -> evaluate (tau per category on held-out prompts) -> export (published format)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from dflash_plugin.errors import DFlashError
from dflash_plugin.train.sources import SOURCE_NAMES

HELP = "train a DFlash drafter for a target (resumable stages)"
STAGES = ("prompts", "responses", "features", "train", "evaluate", "export")
MASK_TOKEN_CANDIDATES = ("<|MASK|>", "<mask>", "<empty_output>", "<|fim_pad|>")


def add_arguments(p):
    p.add_argument("--workdir", required=True, help="folder for every stage's files")
    p.add_argument("--target", help="Hugging Face target folder (default: embedded SmolLM2-135M)")
    p.add_argument("--stages", default=",".join(STAGES), help="comma list, run in order")
    p.add_argument("--prompt-generator", choices=["real", "templates"], default="real",
                   help="prompts stage: real (text and code from Debian packages plus generated "
                        "maths and reasoning, dflash_plugin/train/sources; the packages are "
                        "fetched with apt-get download into $DFLASH_HOME/sources) or templates "
                        "(the older seed-list generator, dflash_plugin/train/prompts.py)")
    p.add_argument("--prompt-sources", type=parse_sources, default=None,
                   help="real generator: comma list of sources (default: all of "
                        f"{','.join(SOURCE_NAMES)})")
    p.add_argument("--num-prompts", type=int, default=32000,
                   help="real generator: prompts to build (held-out ones included)")
    p.add_argument("--per-category", type=int, default=400,
                   help="templates generator: prompts per category")
    p.add_argument("--eval-per-category", type=int, default=20, help="held-out prompts per category")
    p.add_argument("--max-response-tokens", type=int, default=1024,
                   help="cap on each answer (most end earlier, at EOS)")
    p.add_argument("--response-temperature", type=float, default=0.0)
    p.add_argument("--response-engine", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--max-len", type=int, default=1024, help="max tokens per training sequence")
    p.add_argument("--target-layer-ids", help="comma list (default: 5 spread over the target)")
    p.add_argument("--num-draft-layers", type=int, default=3)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--mask-token-id", type=int, help="default: a special token the target never emits")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="reduced draft vocabulary (vLLM d2t format); default: the target's")
    p.add_argument("--epochs", type=float, default=6.0)
    p.add_argument("--anchors-per-seq", type=int, default=48)
    p.add_argument("--seqs-per-step", type=int, default=4)
    p.add_argument("--anchor-sampling", choices=["uniform", "block-starts"], default="uniform",
                   help="uniform over the answer (the paper), or weighted towards the positions "
                        "where greedy decoding starts blocks, found by a cheap no-grad pass that "
                        "drafts one token after every position (~10%% more time per step)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--gamma", type=float, help="loss decay over block positions "
                   "(default: the paper's value for the block size, 7 for 16)")
    p.add_argument("--online-features", action="store_true",
                   help="train stage: run the target on each sequence as training reaches it "
                        "instead of reading the features stage's store (no disk; the same cost "
                        "for about one epoch, dearer for more)")
    p.add_argument("--distill-weight", type=float, default=0.0,
                   help="share of the loss (0-1) that is a KL towards the target's whole "
                        "next-token distribution instead of cross-entropy on its token (not in "
                        "the paper; needs --online-features; default 0: the paper's loss)")
    p.add_argument("--lookup-hints", type=float, default=0.0,
                   help="share (0-1) of the training blocks with a prompt-lookup match that "
                        "carry the lookup's continuation in their mask slots; a drafter trained "
                        "so reads them when serving (dflash_config.lookup_hints; default 0: "
                        "masks only, the paper)")
    p.add_argument("--compute-dtype", choices=["bfloat16", "float32"], default=None,
                   help="how the drafter computes while training (default: bf16 autocast, or "
                        "float32 on a CPU without native bf16, where bf16 matmuls run in "
                        "software and are several times slower)")
    p.add_argument("--device", type=parse_device, default="cpu",
                   help="train stage: where the drafter and the online target run: cpu "
                        "(default) or a CUDA device (cuda, cuda:1); the other stages run on the CPU")
    p.add_argument("--time-budget", type=float, metavar="MINUTES",
                   help="train stage: fit the learning-rate schedule to this much wall time "
                        "(measured over the first steps) instead of --epochs, and stop there")
    p.add_argument("--init-from", help="continue from this drafter checkpoint (fresh schedule); "
                   "one with fewer layers than --num-draft-layers is grown by layers that start "
                   "as the identity, one with more keeps --keep-layers of them")
    p.add_argument("--keep-layers", type=parse_layer_list, default=None,
                   help="with --init-from a deeper drafter than --num-draft-layers: which of its "
                        "layers to keep, a comma list of indices (default: the first "
                        "--num-draft-layers - 1 and the last)")
    p.add_argument("--max-steps", type=int, help="stop after this many steps (schedule unchanged)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-max-new-tokens", type=int, default=128)
    p.add_argument("--eval-limit", type=int, help="evaluate on at most this many held-out prompts "
                   "(taken evenly across categories)")
    p.add_argument("--eval-draft", help="evaluate stage: this drafter folder (an export, the "
                   "shipped drafter, a downloaded one; its draft_vocab.json is honoured) instead "
                   "of the run's checkpoint")
    p.add_argument("--eval-prompts", help="evaluate stage: a prompts JSONL (as the prompts stage "
                   "writes) instead of the work directory's held-out split")
    p.add_argument("--eval-temperatures", default="0,1", type=parse_temperatures,
                   help="evaluate stage: comma list of sampling temperatures (default: 0,1)")
    p.add_argument("--eval-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype of the evaluation (float32: exact lossless check, and faster "
                        "than bf16 on CPUs without native bf16 attention)")
    p.add_argument("--export", help="copy the trained drafter here (bf16, published format)")
    p.add_argument("--export-vocab", choices=["full", "draft"], default="full",
                   help="full: drop a reduced draft vocabulary whose head is the target's own "
                        "rows, so every engine loads the drafter (default); draft: keep it")


def parse_sources(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in SOURCE_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown prompt source(s) {', '.join(unknown) or text!r};"
                                         f" choose from {', '.join(SOURCE_NAMES)}")
    return names


def parse_device(text: str) -> str:
    try:
        kind = torch.device(text).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"--device {text!r}: choose cpu or a CUDA device "
                                         "(cuda, cuda:1)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"--device {text!r}: no CUDA device is available here")
    return text


def parse_layer_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 0 for v in values) or sorted(set(values)) != values:
        raise argparse.ArgumentTypeError(f"expected distinct ascending layer indices like 0,3,7, "
                                         f"got {text!r}")
    return values


def parse_temperatures(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(not 0.0 <= v <= 10.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected a comma list of temperatures in [0, 10], "
                                         f"got {text!r}")
    return values


def pick_mask_token(tokenizer) -> int:
    if tokenizer.mask_token_id is not None:
        return tokenizer.mask_token_id
    vocab = tokenizer.get_vocab()
    for name in MASK_TOKEN_CANDIDATES:
        if name in vocab:
            return vocab[name]
    raise DFlashError("the target tokenizer has no mask-like token; pass --mask-token-id")


def layer_ids(args, num_target_layers: int) -> list[int]:
    from dflash_plugin.layout import default_target_layer_ids

    if args.target_layer_ids:
        ids = [int(x) for x in args.target_layer_ids.split(",")]
    else:
        ids = default_target_layer_ids(num_target_layers, 5)
    if any(not 0 <= i < num_target_layers for i in ids):
        raise DFlashError(f"--target-layer-ids {ids} outside the target's {num_target_layers} layers")
    return ids


def run(args) -> int:
    from dflash_plugin.target import load_target, resolve_target
    from dflash_plugin.train import prompts as prompt_set

    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise DFlashError(f"unknown stages {unknown}; choose from {', '.join(STAGES)}")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    target_path = resolve_target(args.target)
    train_file, eval_file = work / "prompts_train.jsonl", work / "prompts_eval.jsonl"
    eval_prompts_file = Path(args.eval_prompts) if args.eval_prompts else eval_file
    if "evaluate" in stages and "prompts" not in stages and not eval_prompts_file.is_file():
        raise DFlashError(f"no held-out prompts at {eval_prompts_file}: run the prompts stage "
                          "or pass --eval-prompts")
    if "prompts" in stages and args.prompt_generator == "real":
        from dflash_plugin.train.sources.stage import build_prompt_files
        report = build_prompt_files(work, num_prompts=args.num_prompts, sources=args.prompt_sources,
                                    seed=args.seed, eval_per_category=args.eval_per_category,
                                    train_name=train_file.name, eval_name=eval_file.name)
        print(f"prompts: {report['train_prompts']} for training, {report['held_out_prompts']} "
              f"held out, {report['train_followups']} with a follow-up; duplicate rate "
              f"{100 * report['duplicate_rate']:.1f}%, evaluation overlaps dropped "
              f"{report['contaminated'] + report['resembling_eval']} "
              f"(details: {work / 'prompts_report.json'})", flush=True)
    elif "prompts" in stages:
        prompts = prompt_set.build_prompts(args.per_category + args.eval_per_category, seed=args.seed)
        train, held_out = prompt_set.split_prompts(prompts, args.eval_per_category, seed=args.seed)
        prompt_set.write_jsonl(train_file, train)
        prompt_set.write_jsonl(eval_file, held_out)
        (work / "PROVENANCE.txt").write_text(prompt_set.PROVENANCE + "\n")
    if "responses" in stages:
        from dflash_plugin.train.responses import generate_responses
        generate_responses(target_path, prompt_set.read_jsonl(train_file), work / "responses.jsonl",
                           max_tokens=args.max_response_tokens,
                           temperature=args.response_temperature, seed=args.seed,
                           engine=args.response_engine)
    # Export reads the target's LM head only to drop a reduced draft vocabulary.
    full_vocab_export = "export" in stages and args.export and args.export_vocab == "full"
    needs_model = bool({"features", "train", "evaluate"} & set(stages)) or full_vocab_export
    # The target runs in the training's compute dtype: bf16, or float32 where bf16 is emulated.
    from dflash_plugin.train.trainer import TrainingPrecision
    precision = TrainingPrecision(args.compute_dtype, args.device)
    target_dtype = getattr(torch, precision.name)
    target, tokenizer = load_target(target_path, dtype=target_dtype) if needs_model else (None, None)
    if "features" in stages:
        from dflash_plugin.train.feature_store import build_feature_store
        build_feature_store(target, work / "responses.jsonl", work / "features",
                            layer_ids(args, target.config.num_hidden_layers),
                            max_len=args.max_len, target_name=str(target_path))
    if "train" in stages:
        from dflash_plugin.train.trainer import TrainConfig, Trainer
        target.to(args.device)
        cfg = TrainConfig(store=str(work / "features"), out_dir=str(work / "run"),
                          num_draft_layers=args.num_draft_layers, block_size=args.block_size,
                          mask_token_id=args.mask_token_id if args.mask_token_id is not None
                          else pick_mask_token(tokenizer),
                          draft_vocab_size=args.draft_vocab_size, epochs=args.epochs,
                          anchors_per_seq=args.anchors_per_seq, seqs_per_step=args.seqs_per_step,
                          lr=args.lr, seed=args.seed, max_steps=args.max_steps,
                          gamma=args.gamma, init_from=args.init_from,
                          distill_weight=args.distill_weight, compute_dtype=precision.name,
                          lookup_hints=args.lookup_hints, keep_layers=args.keep_layers,
                          anchor_sampling=args.anchor_sampling, device=args.device,
                          time_budget_s=None if args.time_budget is None
                          else 60 * args.time_budget)
        online = None
        if args.online_features:
            from dflash_plugin.train.feature_store import OnlineFeatures
            online = OnlineFeatures(target, work / "responses.jsonl",
                                    layer_ids(args, target.config.num_hidden_layers),
                                    max_len=args.max_len, target_name=str(target_path))
        Trainer(cfg, target, online).run()
    if "evaluate" in stages:
        from dflash_plugin.checkpoint import load_drafter
        from dflash_plugin.train.evaluate import evaluate_drafter, write_report
        held_out = prompt_set.spread_over_categories(prompt_set.read_jsonl(eval_prompts_file),
                                                     args.eval_limit)
        eval_dtype = getattr(torch, args.eval_dtype)
        target = target.to("cpu", eval_dtype)
        if args.eval_draft:
            from dflash_plugin.draft_vocab import load_drafter_for_target
            drafter = load_drafter_for_target(target, args.eval_draft, eval_dtype)
        else:
            drafter = load_drafter(work / "run" / "checkpoint", dtype=eval_dtype)
        report = evaluate_drafter(target, tokenizer, drafter, held_out,
                                  max_new_tokens=args.eval_max_new_tokens, seed=args.seed,
                                  temperatures=args.eval_temperatures)
        write_report(report, work / "eval.json")
        print(json.dumps(report, indent=1))
    if "export" in stages and args.export:
        from dflash_plugin.checkpoint import load_drafter
        from dflash_plugin.train.export import export_drafter
        drafter = load_drafter(work / "run" / "checkpoint", dtype=torch.float32)
        head = target.get_output_embeddings().weight.data.float().cpu() if full_vocab_export else None
        export_drafter(drafter, head, args.export, vocab=args.export_vocab)
        for extra in ("eval.json", "PROVENANCE.txt"):
            if (work / extra).is_file():
                shutil.copy(work / extra, Path(args.export) / extra)
    return 0
