// fsdp/checkpoint/checkpoint.hpp: sharded checkpoints (one HDF5 file per shard).
//
// A checkpoint is a directory `run_dir/checkpoints/step_00000100/` holding one HDF5 file per
// shard of the shard group, `shard_00000-of-00004.h5` ... (docs/checkpoint.md has the full
// format). Each file holds the run metadata as root attributes and, per FSDP unit, this
// shard's fp32 slice of the FlatParameter plus the optimizer state of the same slice, and the
// unit's FlatParamLayout (names, shapes, offsets) so that full tensors can be rebuilt
// (fsdp_merge) without the training config. Like PyTorch's SHARDED_STATE_DICT
// (torch.distributed.checkpoint), each rank writes only what it owns; unlike it, the shards
// are the flat FSDP slices, so saving and resuming at the same shard-group size is a plain
// copy with no collective. A resume on another world size, shard size or wrap policy
// (read_resharded) matches parameters by name and reads, per rank, only the flat ranges of its
// new shard from the old files (docs/checkpoint.md "Resharding on resume").
//
// Files are written atomically (temp name + rename); a step directory is committed by
// renaming `step_N.tmp` to `step_N`, and `checkpoints/latest` names the newest complete step.
//
// Integrity (format version 2): every tensor dataset carries the XXH3-64 checksum of its
// little-endian float32 bytes (dataset attribute `xxh3_64`, 16 lowercase hex digits). Every
// read verifies the checksum of the whole dataset once and that every value is finite;
// writing refuses non-finite values. Version-1 files (no checksums) still load: only the
// finiteness check applies to them.
//
// Metadata and identity (format version 3): every attribute the reader uses (root: step,
// mesh, model_config, train_config, optimizer counters, run ids, ...; per unit: name, sizes,
// entries (names, shapes, offsets), state; per dataset: its xxh3_64) is covered by one
// XXH3-64, the root attribute `metadata_xxh3_64` (metadata_checksum), verified when a file
// is opened, before any value of it is used. Every shard carries the run's `run_id` (drawn
// once when a run starts fresh, kept across --resume) and the `launch_id` of the fsdp_train
// process start that wrote it; the shards of one step must agree on both (CheckpointSet).
// Version-2 files (no metadata checksum, no ids) still load, without those two checks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp/flat_param.hpp"

namespace fsdp::h5 {
class File;
}

namespace fsdp::ckpt {

inline constexpr const char* kFormatName = "fsdp_train.checkpoint";
inline constexpr int64_t kFormatVersion = 3;     // what write_shard_file writes
inline constexpr int64_t kMinFormatVersion = 1;  // oldest version ShardFile::open reads
// Largest `step` attribute accepted on load (2^40): anything above is a corrupted or forged file.
inline constexpr int64_t kMaxStep = int64_t{1} << 40;
// Name of the per-dataset checksum attribute (format version >= 2).
inline constexpr const char* kChecksumAttr = "xxh3_64";
// Name of the root attribute holding metadata_checksum() of the file (format version >= 3).
inline constexpr const char* kMetadataChecksumAttr = "metadata_xxh3_64";

// The default CheckpointMeta::run_id and ::launch_id: one new_run_id() drawn on the first
// call and returned by every later call in this process.
const std::string& process_run_id();

// Run-level metadata stored as root attributes of every shard file.
struct CheckpointMeta {
  int64_t step = 0;                // optimizer steps completed when saved
  int world_size = 1;              // ranks of the run that saved
  int shard_size = 1;              // shards per unit = shard-group size (1 under NO_SHARD)
  int replicate_size = 1;          // replicas (HYBRID_SHARD); world = replicate x shard
  int shard_index = 0;             // which shard this file holds, in [0, shard_size)
  std::string sharding_strategy;   // "FULL_SHARD", ... (informational)
  std::string optimizer;           // "adamw" | "sgd"
  std::string model_config_json;   // {"model_type":"gpt2","n_layer":..,"n_head":..,"n_embd":..,
                                   //  "n_positions":..,"vocab_size":..,"layer_norm_epsilon":..}
  std::string train_config_toml;   // resolved config (informational)
  uint64_t seed = 0;               // stored as an int64 attribute with the same bits
  int64_t sampler_epoch = 0;
  int64_t sampler_position = 0;
  int64_t optimizer_updates = -1;  // optimizer updates applied (< step when fp16 steps were
                                   // skipped); -1 when absent (older files): equals step
  double loss_scale = 0;           // fp16 dynamic loss scale; 0 when not used / absent
  int64_t loss_scale_good_steps = 0;  // steps since the last scale change (GradScaler tracker)
  // config_fingerprint(train_config_toml) of the run that saved (16 hex digits): equal for
  // runs that may resume each other. "" in version-1 files.
  std::string config_fingerprint;
  // Identity (format version 3; "" in older files), each 32 lowercase hex digits (new_run_id):
  // run_id: drawn when a run starts fresh and kept by every --resume (also on another world
  // size or mesh), so all checkpoints of one run, however often it was resumed, carry it.
  // launch_id: drawn by every start of fsdp_train (fresh or --resume); all shards of one step
  // are written by one launch. A step whose shards disagree on either is refused.
  // Both default to process_run_id(), so a tool or test that writes every shard of a step from
  // one process need not set them; the trainer (one process per rank) sets both, from rank 0.
  std::string run_id = process_run_id();
  std::string launch_id = process_run_id();
  int64_t format_version = kFormatVersion;  // of the file read (ignored when writing)
};

// A fresh identifier: 128 bits as 32 lowercase hex digits, from std::random_device mixed
// (XXH3-128) with the wall and steady clocks, the process id and a per-process counter, so
// two calls never return the same value in practice, also when random_device is unavailable
// (then the clocks, pid and counter alone). Never throws. What the trainer's rank 0 draws for
// CheckpointMeta::run_id (a fresh run) and ::launch_id (every start), then broadcasts.
std::string new_run_id();
// True if `id` is 32 lowercase hex digits (what new_run_id returns).
bool is_run_id(const std::string& id);

// XXH3-64 (16 lowercase hex digits) of the metadata of the shard file at `path`: the value its
// `metadata_xxh3_64` attribute must hold. Covers every attribute the reader uses, read from
// the file: the root attributes (format, format_version, step, world_size, shard_size,
// replicate_size, shard_index, sharding_strategy, optimizer, seed, sampler_epoch,
// sampler_position, optimizer_updates, loss_scale, loss_scale_good_steps, model_config,
// train_config, config_fingerprint, run_id, launch_id, num_units), for each unit group
// /units/<u> (u < num_units, while the group exists) unit_name, numel, padded_numel,
// num_shards, shard_numel, entries, state, and for each dataset it names ("param", then the
// `state` list) its xxh3_64 attribute. The hashed bytes, item by item in that order: object
// path, NUL, attribute name, NUL, then 'i' + int64 little-endian, 'f' + float64 bits
// little-endian, 's' + uint64 little-endian length + the string's bytes, or '-' for an absent
// attribute (docs/checkpoint.md "Integrity"). write_shard_file stores it, ShardFile::open
// verifies it; exposed so tools and tests can recompute it. Throws InputError naming the file
// if it does not open as HDF5 or an attribute has another type than the format's.
std::string metadata_checksum(const std::string& path);

// XXH3-64 of `count` floats' little-endian bytes as 16 lowercase hex digits: the value of a
// dataset's `xxh3_64` attribute.
std::string checksum_hex(const float* data, int64_t count);
// Index of the first NaN or infinity among data[0, count), or -1 if all are finite (the scan
// write_shard_file and every read run).
int64_t first_nonfinite(const float* data, int64_t count);

// One unit's shard as the trainer holds it: `param` and every `state` buffer are
// layout->shard_numel fp32 values (the slice [s*shard_numel, (s+1)*shard_numel) of the
// padded flat buffer). `state` names are dataset names: "exp_avg", "exp_avg_sq" (AdamW,
// torch.optim.AdamW's state keys) or "momentum_buffer" (SGD).
// `fetch` empty: the pointers are host memory, read in place. Else they are another memory's
// (a device's) and fetch(src, dst, n) copies n floats from `src` into host memory at `dst`
// (complete when it returns): write_shard_file then reads each dataset through one host buffer
// reused for all of them, so a synchronous save holds one dataset in host memory at a time
// instead of the rank's whole shard (GPT 7B on one GPU: 40 GB at ratio 0.5, 80 GB without
// offload).
using ShardFetch = std::function<void(const float* src, float* dst, int64_t n)>;
struct UnitShardView {
  const FlatParamLayout* layout = nullptr;
  const float* param = nullptr;
  std::vector<std::pair<std::string, const float*>> state;
  ShardFetch fetch;
};

// Writes one shard file (format version 3): meta as root attributes, unit i as group
// /units/<i> (i = index in `units`), each dataset with its `xxh3_64` checksum attribute, and
// last the root attribute `metadata_xxh3_64` (metadata_checksum of what was written). Written through
// fsdp::AtomicFile (`path + ".tmp"`, fsync, rename, directory fsync), so `path` is either
// absent or complete. Throws fsdp::Error naming `path` on I/O failure, e.g. "...: No space
// left on device" (the temp file is removed), before touching the disk on invalid input
// (null pointers, layout whose num_shards != meta.shard_size, state name that is empty,
// "param", or contains '/', meta.run_id or meta.launch_id not 32 lowercase hex digits), and
// on a non-finite value: "<path>: refusing to save step N:
// tensor /units/3/param (unit h.1) element 17 (flat element 1041, parameter ...) is nan".
// Host buffers (views without `fetch`) are scanned (and hashed, in the same pass) before the
// file is created, so their NaN or infinity never reaches even the temporary file; a fetched
// dataset is scanned as it is written, and its non-finite value ends the write with the same
// error and the temporary file removed (nothing is published either way).
void write_shard_file(const std::string& path, const CheckpointMeta& meta,
                      const std::vector<UnitShardView>& units);

// A shard file opened for reading. Opening validates the format attributes and the stored
// layouts (InputError naming the file if not an fsdp_train checkpoint, a format version
// outside [kMinFormatVersion, kFormatVersion], a `step` attribute outside [0, kMaxStep]
// ("<file>: root attribute step = -5 is out of range [0, 2^40]"), optimizer_updates outside
// [0, step], or inconsistent layout metadata). Opening reads no tensor data.
// Metadata checksum: a file of format version 3, or of any version holding a
// `metadata_xxh3_64` attribute (a version number changed after the save), is verified
// against metadata_checksum() right after its format and version are read, before any other
// value is used: "<file>: metadata checksum mismatch (stored X, computed Y): an attribute was
// changed after the save (model config, layouts, step, run id, optimizer state, ...); the file
// is corrupted", or "<file>: no metadata_xxh3_64 attribute (format_version 3 has one): the
// file is corrupted". Version 3 also requires run_id and launch_id of 32 lowercase hex digits.
//
// Integrity: every read verifies the dataset it reads from, once per dataset and ShardFile:
// the XXH3-64 checksum of the whole dataset against its `xxh3_64` attribute (skipped for
// format version 1) and that every value is finite. Failures are InputError:
//   "<file>: tensor /units/3/param (unit h.1): checksum mismatch (stored X, computed Y): the file is corrupted"
//   "<file>: tensor /units/3/param (unit h.1): element 17 (flat element 1041, parameter h.1.ln_1.weight) is nan"
// (a checksum mismatch wins when both apply). Not thread-safe (the verified set is cached).
class ShardFile {
 public:
  static ShardFile open(const std::string& path);
  ShardFile(ShardFile&&) noexcept;
  ShardFile& operator=(ShardFile&&) noexcept;
  ~ShardFile();

  const std::string& path() const;
  const CheckpointMeta& meta() const { return meta_; }
  // The stored layouts, unit order; each entry's ParamSpec has name, shape and
  // weight_decay (init fields are defaults: they are not stored).
  const std::vector<FlatParamLayout>& layouts() const { return layouts_; }
  int num_units() const { return static_cast<int>(layouts_.size()); }
  // Optimizer-state dataset names stored for `unit` (e.g. {"exp_avg", "exp_avg_sq"}).
  const std::vector<std::string>& state_names(int unit) const;
  bool has_dataset(int unit, const std::string& dataset) const;

  // Reads dataset "param" or a state name of `unit`: shard_numel floats into `out`, and
  // verifies them (checksum, finite; see above). Throws InputError naming the file if the
  // unit or dataset does not exist or the data fails verification (`out` then holds the bad
  // data: callers must not use it).
  void read_unit(int unit, const std::string& dataset, float* out) const;
  // Reads `count` floats starting at element `offset` of this shard's slice (a hyperslab).
  // The first partial read of a dataset verifies the whole dataset first (streamed in 4 MiB
  // chunks: memory stays bounded); InputError as read_unit.
  void read_unit_range(int unit, const std::string& dataset, int64_t offset, int64_t count,
                       float* out) const;
  // Verifies one dataset (checksum and finiteness) unless already verified; InputError as
  // read_unit. verify_all: every dataset of every unit (what fsdp_merge does before writing).
  void verify(int unit, const std::string& dataset) const;
  void verify_all() const;

  // Checks that this checkpoint can be resumed by a run with `expected` meta and layouts:
  // world_size, shard_size, replicate_size, shard_index, optimizer, the number of units
  // and each unit's name, numel, num_shards, padded_numel, shard_numel and entries
  // (name, shape, offset). Throws InputError "<file>: incompatible checkpoint: <what>
  // differs (checkpoint has X, run has Y)" on the first difference.
  void check_compatible(const CheckpointMeta& expected,
                        const std::vector<FlatParamLayout>& expected_layouts) const;

 private:
  ShardFile();
  std::unique_ptr<h5::File> file_;  // the open file (HDF5 kept out of this header)
  CheckpointMeta meta_;
  std::vector<FlatParamLayout> layouts_;
  std::vector<std::vector<std::string>> state_names_;
  mutable std::vector<std::vector<std::string>> verified_;  // per unit: datasets verified
  bool is_verified(int unit, const std::string& dataset) const;
  // Checks a whole dataset's data (`n` floats) against its checksum attribute and for
  // finiteness; marks it verified.
  void check_data(int unit, const std::string& dataset, const float* data, int64_t n) const;
};

// All shard files of one step directory, checked complete and consistent: every
// shard_i-of-N for i < N present (InputError naming the first missing file), each opened
// (and its metadata checksum verified) by ShardFile::open, each with the same step (else
// InputError naming both files: "<shard 1>: step 1 differs from <shard 0> (step 2)"), mesh,
// optimizer, layouts, model_config, format version, run_id and launch_id ("<shard 1>: run_id
// X differs from <shard 0> (run_id Y): the shards come from different runs"; "... launch_id
// ...: the shards were written by different launches of fsdp_train"), config_fingerprint,
// the same counters (seed, sampler_epoch, sampler_position, optimizer_updates, loss_scale,
// loss_scale_good_steps), shard_size N and its own shard_index. Opening reads metadata
// only; reads verify as ShardFile's do.
class CheckpointSet {
 public:
  static CheckpointSet open(const std::string& step_dir);
  const std::string& dir() const { return dir_; }
  const CheckpointMeta& meta() const { return shards_.front().meta(); }  // shard 0's
  const std::vector<FlatParamLayout>& layouts() const { return shards_.front().layouts(); }
  int shard_size() const { return static_cast<int>(shards_.size()); }
  const ShardFile& shard(int s) const { return shards_.at(s); }
  // Verifies every dataset of every shard file (ShardFile::verify_all); InputError naming
  // the file and tensor on the first failure.
  void verify_all() const;
  // Reads flat elements [begin, begin + count) of `unit`'s unsharded FlatParameter
  // ("param") or state dataset, gathering the pieces from each shard file that holds them
  // (hyperslab reads). Range must lie within padded_numel.
  void read_flat(int unit, const std::string& dataset, int64_t begin, int64_t count,
                 float* out) const;

 private:
  std::string dir_;
  std::vector<ShardFile> shards_;
};

// ---- resharding: resume on another world size, shard size or wrap policy ----
//
// True if `a` and `b` describe the same units in the same order with the same name, numel,
// num_shards, padded_numel, shard_numel and entries (name, shape, offset): a resume may then
// copy each shard from the file of the same shard index (the fast path).
bool same_layouts(const std::vector<FlatParamLayout>& a, const std::vector<FlatParamLayout>& b);

// Fills `out` (layout.shard_numel floats) with shard `shard_index` of `layout`, i.e. flat
// elements [layout.shard_begin(shard_index), layout.shard_end(shard_index)) of `dataset`
// ("param" or an optimizer-state name such as "exp_avg"), taken from a checkpoint saved with
// any shard count and any unit layout (wrap policy). Each parameter of `layout` is looked up
// BY NAME among the entries of set.layouts(); only the part of it that falls in the new
// shard is read, from the old shard files that hold it (CheckpointSet::read_flat: hyperslab
// reads), so a rank reads about 1/M of the model for M new shards. Padding elements (past
// layout.numel) are set to 0. A vocabulary-padded parameter (ParamSpec::vocab_rows > 0 in
// `layout`) may be stored with another number of pad rows (a run with another
// model.pad_vocab_multiple, or an older unpadded one): its first vocab_rows rows are read and
// its pad rows set to 0 (they hold 0 in training: zero init, zero gradient). The first read of each old dataset verifies it whole
// (checksum, finiteness; streamed once per dataset and CheckpointSet, see ShardFile).
// Throws InputError naming the checkpoint directory and the tensor:
//   "<dir>: parameter h.0.ln_1.weight (unit h.0) is missing from the checkpoint"
//   "<dir>: parameter wte.weight: shape [256,16] in the checkpoint (unit root) differs from
//    the run's [128,16]"
//   a parameter stored twice in the checkpoint, an old unit without `dataset`, or a dataset
//   failing verification (ShardFile's messages). fsdp::Error if shard_index is outside
//   [0, layout.num_shards).
void read_resharded(const CheckpointSet& set, const FlatParamLayout& layout, int64_t shard_index,
                    const std::string& dataset, float* out);

// Opens this rank's shard file of `step_dir` for a resume and checks it against the run
// (ShardFile::check_compatible). If the file shard_file_name(expected.shard_index,
// expected.shard_size) is absent but the directory holds shard files of another shard
// count, the InputError says "<step_dir>: incompatible checkpoint: shard_size differs
// (checkpoint has N, run has M)" instead of naming a missing file.
ShardFile open_for_resume(const std::string& step_dir, const CheckpointMeta& expected,
                          const std::vector<FlatParamLayout>& expected_layouts);

// ---- directory layout and the commit protocol ----
// run_dir/checkpoints/
//   step_00000100/shard_00000-of-00002.h5, shard_00001-of-00002.h5
//   latest            text file: "step_00000100\n"
// Trainer protocol: rank 0 prepare_tmp_step_dir; barrier; each shard-group rank of replica 0
// write_shard_file(tmp/shard_file_name(...)); barrier; rank 0 commit_step_dir then
// publish_latest. With checkpoint.async_save the write runs in an AsyncShardWriter thread
// and the commit waits until every rank's write finished (docs/checkpoint.md).

// A shape as JSON, "[2,3]": how checkpoint, merge and init_from messages print shapes.
std::string shape_json(const std::vector<int64_t>& shape);
std::string checkpoints_dir(const std::string& run_dir);          // run_dir/checkpoints
std::string step_dir_name(int64_t step);                          // "step_%08d": step_00000100
std::string step_dir(const std::string& run_dir, int64_t step);   // checkpoints/step_00000100
std::string tmp_step_dir(const std::string& run_dir, int64_t step);  // .../step_00000100.tmp
std::string shard_file_name(int shard_index, int shard_size);     // shard_00001-of-00004.h5

// Removes a stale `tmp` left by a crashed save, then creates it (and parents).
void prepare_tmp_step_dir(const std::string& tmp);
// Removes `tmp` and everything in it (a save that failed on some rank); never throws.
void discard_tmp_step_dir(const std::string& tmp) noexcept;
// fsyncs `tmp`, then renames directory `tmp` to `final` (fsdp/core/atomic_file.hpp
// rename_durably: the parent directory is fsynced too). Throws fsdp::Error naming the path. If `final` exists (saving the same step again), it
// is renamed to `final + ".old"`, the new one renamed in, then the old one removed, so a
// complete `final` exists at every moment except between two renames.
void commit_step_dir(const std::string& tmp, const std::string& final_dir);
// Writes run_dir/checkpoints/latest = step_dir_name(step) + "\n" atomically
// (write_file_atomically: temp file, fsync, rename, directory fsync). Throws fsdp::Error
// naming checkpoints/latest and strerror; the previous `latest` is then unchanged.
void publish_latest(const std::string& run_dir, int64_t step);
// checkpoint.save_total_limit (HF TrainingArguments.save_total_limit, torchtitan's
// checkpoint.keep_latest_k): keeps the `keep` newest checkpoints, the one of `latest_step`
// (the step `latest` names, already published) counted; removes the other complete step
// directories of lower steps, oldest first. Step directories above `latest_step` (left by a
// `latest` rewound by --resume=STEP or by hand) and `.tmp` / `.old` directories are not
// touched. Each removal is rename(step_N -> step_N.deleting), then a recursive delete, so an
// interrupted one leaves no directory that looks complete; leftover `step_N.deleting`
// directories are removed too.
// Never throws: what could not be renamed or removed is returned, one line per path
// (strerror), and the caller warns (a checkpoint that stays is not worth the run).
// keep < 1: nothing is done.
struct PruneResult {
  std::vector<std::string> removed;  // step directory names, oldest first ("step_00000100")
  std::vector<std::string> errors;   // "PATH: cannot remove: Permission denied"
};
PruneResult prune_step_dirs(const std::string& run_dir, int64_t latest_step, int64_t keep);
// The step directory named by run_dir/checkpoints/latest, as a path; nullopt if there is
// no `latest` file. InputError naming `latest` if it is empty, longer than 4 KiB, not of the
// form step_<8 or more digits> (the content is quoted escaped, \xNN, and cut to 64 bytes:
// it may be binary garbage) or names a directory that does not exist.
std::optional<std::string> find_latest(const std::string& run_dir);

// Whether `dir` is a directory holding shard_<i>-of-<n>.h5 files (a checkpoint step directory).
bool is_step_dir(const std::string& dir);

// The steps of the checkpoints in run_dir/checkpoints, ascending: each directory named
// step_<8 to 18 digits> that holds shard files (is_step_dir; not step_N.tmp, .old or
// .deleting). Empty when there is none or the directory cannot be listed. Never throws.
std::vector<int64_t> checkpoint_steps(const std::string& run_dir);

// The step directory `fsdp_train --resume=CHOICE` continues from (HF Trainer's
// resume_from_checkpoint, DeepSpeed's load_checkpoint tag, torchtitan's checkpoint.load_step):
// `choice` is a step number ("4": run_dir/checkpoints/step_00000004) or the path of a step
// directory in run_dir/checkpoints (also run_dir, its checkpoints directory or `latest`,
// followed as resolve_step_dir does). Throws InputError "--resume=CHOICE: ..." when it names no
// checkpoint of this run directory (listing the steps there are), or a directory elsewhere
// (another run's weights start a new run through fsdp_merge and model.init_from).
std::string resume_step_dir(const std::string& run_dir, const std::string& choice);

// What a reader of one checkpoint (fsdp_merge's STEP_DIR) is given, as the step directory to
// open. `path` is taken as given when it is a directory holding shard files, or none of the
// forms below (CheckpointSet::open then judges it). Otherwise `latest` is followed, as
// find_latest does (DeepSpeed's zero_to_fp32.py reads the `latest` file of the checkpoint
// folder it is given the same way): `path` is a file named `latest`, a checkpoints directory
// holding `latest`, or a run directory holding checkpoints/latest. `latest` is the file
// followed ("" when `path` is returned as given). Throws find_latest's InputError for a
// `latest` that is unreadable, malformed or names a missing step directory.
struct StepDirChoice {
  std::string step_dir;
  std::string latest;
};
StepDirChoice resolve_step_dir(const std::string& path);

}  // namespace fsdp::ckpt
