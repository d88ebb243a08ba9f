// The subcommands that exist today. A command is registered only once it works.
#include "app/commands.h"

#include <functional>
#include <iostream>
#include <memory>

#include "app/build_info.h"
#include "app/checkpoint/ckpt_commands.h"
#include "app/checkpoint/hf_import.h"
#include "app/generate.h"
#include "app/plan_command.h"
#include "app/prepare.h"
#include "app/prepare_images.h"
#include "app/prepare_sft.h"
#include "app/trainer.h"
#include "app/upscale.h"
#include "kernels/check.h"
#include "parallel/mpi.h"

namespace tessera {

namespace {
// Only `train` is parallel. Under mpirun every rank would run one of the others whole (printing
// and writing the same files N times), so they refuse: every rank throws the same error, rank 0
// prints it, and all exit 1. Returns the callback that checks, then runs `run`.
std::function<void()> on_one_process(const std::string& command, std::function<void()> run) {
  return [command, run = std::move(run)] {
    const int ranks = comm_size(MPI_COMM_WORLD);
    if (ranks > 1)
      throw CollectiveError("tessera " + command + " runs on one process; start it without mpirun (got " +
                            std::to_string(ranks) + " ranks)");
    run();
  };
}

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print the build: version, CPU features, BLAS, threads, CUDA");
  cmd->callback([] { std::cout << build_info(); });
}
void register_train(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  cmd->add_option("config", args->config_path, "Config file (TOML), e.g. configs/quickstart.toml")->required();
  cmd->add_option("--set", args->overrides, "Override a config key: --set section.key=value (repeatable)");
  cmd->add_option("--run-dir", args->run_dir, "Run directory (default: <log.dir>/<train.name>)");
  cmd->add_flag("--print-config", args->print_config, "Print the resolved config (defaults filled in) and exit");
  cmd->callback([args, &exit_code] { exit_code = run_train_command(*args); });
}

void register_prepare(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PrepareArgs>();
  auto images = std::make_shared<PrepareImagesArgs>();
  auto sft = std::make_shared<PrepareSftArgs>();
  auto* cmd = app.add_subcommand("prepare", "Tokenize text (.txt, .jsonl) into an indexed dataset (.bin + .idx), or "
                                            "images and captions into an image-text file (.h5)");
  cmd->add_option("--input", args->inputs, "Input files: .jsonl (one JSON object per line, its \"text\") or plain text");
  cmd->add_option("--tokenizer", args->tokenizer, "Tokenizer: gpt2, byte, or a Hugging Face tokenizer.json path")
      ->required();
  cmd->add_option("--vocab", args->vocab_dir,
                  "gpt2: directory holding encoder.json and vocab.bpe (default: data/gpt2, scripts/get_data.sh)");
  cmd->add_option("--out", args->out, "Output prefix: writes PREFIX.bin and PREFIX.idx (with --images: the .h5 file)")
      ->required();
  cmd->add_option("--val-fraction", args->val_fraction, "Hold out the last fraction of documents as PREFIX_val")
      ->capture_default_str();
  cmd->add_option("--separator", args->separator,
                  "Plain text: split documents on this string (\\n allowed, e.g. '\\n\\n'); default one per file");
  cmd->add_option("--append-eot", args->append_eot, "Append the end-of-document token to each document (true/false)")
      ->default_str("true");
  auto* img = cmd->add_option("--images", images->images_dir,
                              "Image-text: the directory of the images (PNG, JPEG) named in --captions");
  cmd->add_option("--captions", images->captions,
                  "Image-text: a .jsonl file, one {\"image\": \"name.png\", \"text\": \"caption\"} per line");
  cmd->add_option("--config", images->config, "Image-text: take vision.image_size and vision.patch_size from this config");
  cmd->add_option("--image-size", images->image_size, "Image-text: resize images to N x N (overrides --config)");
  cmd->add_option("--patch-size", images->patch_size,
                  "Image-text: the encoder's patch side, setting the placeholders per image (overrides --config; "
                  "default 4)");
  cmd->add_option("--on-error", images->on_error,
                  "Image-text and --sft: a bad line or image (missing, truncated, not an image) or a bad record "
                  "refuses the run (refuse, or fail), or is skipped and counted")
      ->check(CLI::IsMember({"refuse", "fail", "skip"}))
      ->capture_default_str();
  img->excludes(cmd->get_option("--input"));
  // Supervised fine-tuning records (app/prepare_sft.h).
  auto* sft_opt = cmd->add_option("--sft", sft->inputs,
                                  "Fine-tuning records (.jsonl): {\"prompt\", \"response\"} or {\"messages\": [...]}; "
                                  "writes PREFIX.bin/.idx and the loss mask PREFIX.mask");
  cmd->add_option("--chat-template", sft->chat_template, "--sft: plain (prompt/response), chatml or llama3")
      ->check(CLI::IsMember({"plain", "chatml", "llama3"}))
      ->capture_default_str();
  sft_opt->excludes(cmd->get_option("--input"));
  sft_opt->excludes(img);
  cmd->callback(on_one_process("prepare", [args, images, sft, &exit_code] {
    if (images->on_error == "fail") images->on_error = "refuse";
    if (!sft->inputs.empty()) {
      TESSERA_CHECK(args->val_fraction == 0 && args->separator.empty(),
                    "prepare --sft: --val-fraction and --separator are for text; hold out records with "
                    "data.val_fraction (documents) or a second --sft file");
      sft->tokenizer = args->tokenizer;
      sft->vocab_dir = args->vocab_dir;
      sft->out = args->out;
      sft->on_error = images->on_error;
      exit_code = run_prepare_sft(*sft, std::cout);
    } else if (!images->images_dir.empty()) {
      TESSERA_CHECK(args->val_fraction == 0 && args->separator.empty(),
                    "prepare --images: --val-fraction and --separator are for text; hold out images with a second "
                    "captions file (scripts/data/prepare_digits.py does)");
      images->tokenizer = args->tokenizer;
      images->vocab_dir = args->vocab_dir;
      images->out = args->out;
      exit_code = run_prepare_images(*images, std::cout);
    } else {
      TESSERA_CHECK(images->captions.empty(), "prepare: --captions goes with --images DIR (the images' directory)");
      exit_code = run_prepare_command(*args);
    }
  }));
}

void register_ckpt(CLI::App& app, int& exit_code) {
  auto* ckpt = app.add_subcommand("ckpt", "Checkpoint files: inspect one, export its model, or import a Hugging Face model");
  ckpt->require_subcommand(1);

  auto inspect = std::make_shared<CkptInspectArgs>();
  auto* cmd = ckpt->add_subcommand("inspect", "Print a checkpoint's metadata and every tensor (shape, dtype, L2 norm)");
  cmd->add_option("file", inspect->file, "Checkpoint file (.h5)")->required();
  cmd->add_flag("--config", inspect->show_config, "Also print the config (TOML) stored in the checkpoint");
  cmd->callback(
      on_one_process("ckpt inspect", [inspect, &exit_code] { exit_code = run_ckpt_inspect(*inspect, std::cout); }));

  auto exp = std::make_shared<CkptExportArgs>();
  cmd = ckpt->add_subcommand(
      "export", "Export the model to Hugging Face format (model.safetensors, config.json and the tokenizer files)");
  cmd->add_option("file", exp->file, "Checkpoint file (.h5)")->required();
  cmd->add_option("--format", exp->format, "Output format")->check(CLI::IsMember({"safetensors"}))->capture_default_str();
  cmd->add_option("--out", exp->out_dir, "Output directory (created if needed)")->required();
  cmd->add_flag("--allow-non-finite", exp->allow_non_finite, "Export even when the model holds NaN or inf values");
  cmd->add_flag("--merge-lora", exp->merge_lora, "A LoRA run's checkpoint: export the merged weights W + (alpha/r) B A");
  cmd->add_flag("--adapters-only", exp->adapters_only,
                "A LoRA run's checkpoint: export only its adapters, as a PEFT folder (adapter_config.json, "
                "adapter_model.safetensors)");
  cmd->add_option("--base-model", exp->base_model,
                  "--adapters-only: base_model_name_or_path to record (default: the run's checkpoint.init_from)");
  cmd->add_option("--vocab", exp->vocab_dir, "GPT-2 tokenizer directory (default: data.vocab_dir, then data/gpt2)");
  cmd->callback(on_one_process("ckpt export", [exp, &exit_code] { exit_code = run_ckpt_export(*exp, std::cout); }));

  auto imp = std::make_shared<CkptImportArgs>();
  cmd = ckpt->add_subcommand("import", "Import a Hugging Face model folder (config.json and safetensors: GPT-2, LLaMA, "
                                       "Mistral; F32, F16 or BF16) as a checkpoint of its weights");
  cmd->add_option("dir", imp->dir, "The model folder: config.json and model.safetensors, or shards with "
                                   "model.safetensors.index.json")->required();
  cmd->add_option("--out", imp->out, "The checkpoint to write (.h5; must not exist)")->required();
  cmd->add_option("--tokenizer", imp->tokenizer,
                  "The tokenizer its ids follow, recorded for generate and export: auto = the folder's tokenizer.json "
                  "when it has one, else recognize its vocab.json and merges.txt (GPT-2's, or tessera's byte or "
                  "addition tokenizer as ckpt export writes them); or gpt2, byte, addition, or a tokenizer.json path")
      ->capture_default_str();
  cmd->add_option("--vocab", imp->vocab_dir, "GPT-2 tokenizer directory (encoder.json, vocab.bpe; default: data/gpt2)");
  cmd->add_flag("--allow-non-finite", imp->allow_non_finite, "Import even when a weight holds NaN or inf");
  cmd->callback(on_one_process("ckpt import", [imp, &exit_code] { exit_code = run_ckpt_import(*imp, std::cout); }));
}
void register_generate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Continue a prompt, or caption an image (--image), with a trained checkpoint (greedy or sampled)");
  cmd->add_option("--ckpt,--checkpoint", args->ckpt, "Checkpoint file (.h5)")->required();
  cmd->add_option("--prompt", args->prompt, "Text to continue (after the image's placeholders with --image)");
  cmd->add_option("--image", args->image,
                  "A PNG or JPEG to caption (vision-language checkpoints): resized to vision.image_size, its "
                  "placeholder tokens before the prompt; stops at the end of the caption");
  auto* max_tokens = cmd->add_option("--max-tokens", args->max_tokens,
                                     "Tokens to generate (default 32, or what the context leaves room for)");
  cmd->add_option("--held-out", args->held_out,
                  "Vision-language checkpoints: caption the first N held-out images (--data, else the checkpoint's "
                  "own validation data) and print each with the exact-match accuracy");
  cmd->add_option("--data", args->data, "With --held-out: the image-text file (.h5) to caption");
  cmd->add_option("--dump", args->dump, "With --held-out: write the captioned samples to this image-text file (.h5)");
  cmd->add_option("--temperature", args->temperature, "0 = greedy; else sample from softmax(logits / T)")
      ->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Sample among the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--vocab", args->vocab_dir,
                  "GPT-2 tokenizer directory (encoder.json, vocab.bpe; default: data.vocab_dir, then data/gpt2)");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "Tokenizer for the prompt and output: gpt2, byte or a Hugging Face tokenizer.json path (default: "
                  "the checkpoint's data.tokenizer)");
  cmd->add_flag("--no-cache", args->no_cache, "Re-run the whole sequence for every token (for comparison)");
  cmd->add_flag("--stop-at-newline", args->stop_at_newline, "Stop after the first newline (addition answers)");
  cmd->callback(on_one_process("generate", [args, max_tokens, &exit_code] {
    args->max_tokens_given = max_tokens->count() > 0;
    exit_code = run_generate_command(*args);
  }));
}

void register_plan(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand("plan", "Choose the parallel layout: search every layout of N ranks, predict each one's "
                                         "step time on a cluster, print the best (docs/planning.md)");
  cmd->add_option("config", args->config_path, "Config file (TOML) to plan for");
  cmd->add_option("--gpus", args->gpus, "Ranks (devices) to plan for");
  cmd->add_option("--cluster", args->cluster, "A [cluster] TOML file, or a preset: h100-sxm-80g, h100-sxm-80g-ib4, "
                                              "h200-141g, h200-141g-ib4, a100-80g, local")
      ->capture_default_str();
  cmd->add_option("--set", args->overrides, "Override a config key (section.key=value) or a cluster key "
                                            "(cluster.key=value); with --calibrate also calibrate.key=value (min_seconds, "
                                            "repeats, gemm_size, stream_elements, max_message_bytes); repeatable");
  cmd->add_option("--gpu-memory", args->gpu_memory, "Device memory, replacing the cluster's (e.g. 80GiB, 141GB)");
  cmd->add_option("--top", args->top, "Layouts to print")->capture_default_str();
  cmd->add_option("--explain", args->explain, "Break row K's step down: compute, exposed communication per group, "
                                              "bubble, optimizer; and its memory");
  cmd->add_option("--emit-config", args->emit_config, "Write the best layout as a config `tessera train` runs");
  cmd->add_option("--dtype", args->dtype, "train.dtype to consider: fp32, bf16 or any")->capture_default_str();
  cmd->add_option("--micro-batch", args->micro_batch, "Plan only this train.micro_batch (default: search it)");
  cmd->add_flag("--predict", args->predict, "Predict the config's own layout (parallel.*, train.micro_batch, "
                                            "train.dtype, model.recompute) instead of searching, and explain it");
  cmd->add_flag("--calibrate", args->calibrate, "Measure this machine's ranks (GEMM, memory bandwidth, all-reduce; "
                                                "under mpirun -n N; with a config also the GEMMs at its step's "
                                                "shapes) and write a cluster file (--out)");
  cmd->add_option("--out", args->out, "--calibrate: the cluster file to write");
  cmd->add_option("--device", args->device, "--calibrate: cpu or cuda (default: the config's train.device, else "
                                            "cpu); cuda measures each rank's GPU as train would use it");
  const auto plan = on_one_process("plan", [args, &exit_code] {
    TESSERA_CHECK(!args->config_path.empty(), "tessera plan: give a config file, e.g. configs/gpt2-124m.toml");
    exit_code = run_plan_command(*args, std::cout);
  });
  // Planning is one process; calibrating measures the ranks it runs on.
  cmd->callback([args, plan, &exit_code] {
    if (args->calibrate) exit_code = run_calibrate_command(*args, std::cout);
    else if (!args->device.empty()) detail::fail("tessera plan: --device is for --calibrate (a plan reads the config's train.device)");
    else plan();
  });
}

void register_upscale(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<UpscaleArgs>();
  auto* cmd = app.add_subcommand("upscale", "Grow a checkpoint deeper (depth up-scaling: solar, stack, interleave, "
                                            "expand, average, ot; docs/upscaling.md)");
  cmd->add_option("--from", args->from, "Source checkpoint (.h5)")->required();
  cmd->add_option("--method", args->options.method, "solar | stack | interleave | expand | average | ot")->required();
  cmd->add_option("--layers", args->options.layers, "Depth of the grown model");
  cmd->add_option("--factor", args->options.factor, "stack: copies of the layer list (default 2)");
  cmd->add_option("--overlap", args->options.overlap, "solar: layers dropped from each copy (default n/4 rounded)");
  cmd->add_option("--every", args->options.every,
                  "interleave, expand, average, ot: a new layer after every k-th layer or pair (default 1)");
  cmd->add_option("--position", args->options.position,
                  "with --layers: where the new layers go: top, bottom or uniform (default)");
  cmd->add_option("--sinkhorn-eps", args->options.sinkhorn_eps,
                  "ot: Sinkhorn-regularized soft alignment of the MLP units with this eps (relative to the largest "
                  "cost); 0 = exact assignment (default)");
  cmd->add_flag("--align-data", args->options.align_data,
                "ot: align the units by their activations on a few batches of the checkpoint's data (its stored "
                "config's; block b run on block a's input) instead of by their weights");
  cmd->add_option("--align-batches", args->options.align_batches,
                  "ot --align-data: micro-batches of the stored train.micro_batch x train.seq_len tokens (default 4)");
  cmd->add_flag("--carry-optimizer", args->carry_optimizer,
                "Carry the AdamW moments and step (new layers take their sources', zero where expand zeroes)");
  cmd->add_option("--out", args->out, "The grown checkpoint (.h5; must not exist)")->required();
  cmd->callback(on_one_process("upscale", [args, &exit_code] { exit_code = run_upscale_command(*args, std::cout); }));
}
}  // namespace

void register_commands(CLI::App& app, int& exit_code) {
  register_info(app);
  register_train(app, exit_code);
  register_prepare(app, exit_code);
  register_ckpt(app, exit_code);
  register_generate(app, exit_code);
  register_upscale(app, exit_code);
  register_plan(app, exit_code);
}

}  // namespace tessera
