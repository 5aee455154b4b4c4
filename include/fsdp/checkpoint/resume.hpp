// fsdp/checkpoint/resume.hpp: which config changes a resume accepts.
//
// A checkpoint stores the resolved config of the run that saved it (to_toml(cfg), root
// attribute `train_config`). `--resume` compares it key by key with the resuming run's: every
// key must be equal except those the config's key table marks (fsdp::resume_may_change,
// fsdp/config/config.hpp; docs/checkpoint.md "Resume checks" explains the choice). Keys are "section.key" as in the TOML file
// ("model.n_head"), so `--set` spells them the same way.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fsdp::ckpt {

// XXH3-64 of the canonical JSON (nlohmann, keys sorted) of {"section.key": "<TOML value>"}
// over the keys of `resolved_toml` that must not change on resume, as 16 lowercase hex
// digits. Two configs a resume accepts have the same fingerprint (keys absent from one side
// aside). Throws InputError "<origin>: ... is not valid TOML: ..." if the text does not parse.
std::string config_fingerprint(const std::string& resolved_toml, const std::string& origin = "config");

// Compares the checkpoint's resolved config (`checkpoint_toml`, from the file `file`) with the
// run's (`run_toml`, to_toml of the run's Config). Keys present on both sides and not
// mutable must be equal (model.type first, then in key order); keys present on
// one side only (written by another fsdp_train version) are not compared. Throws InputError
// "--resume: model.n_head differs (checkpoint has 4, config has 8) in <file>; only the keys
// listed in docs/checkpoint.md \"Resume checks\" may change" on the first difference, and
// "<file>: attribute train_config is not valid TOML: ..." if the stored text does not parse.
void check_resume_config(const std::string& checkpoint_toml, const std::string& run_toml,
                         const std::string& file);

// The first key whose value differs between two resolved configs (to_toml of each), every key
// compared (a key on one side only counts, its missing value printed as "(absent)"):
// {"optim.lr", "0.001", "0.002"} for a's and b's values; nullopt when they are equal. The
// trainer's check that every rank read the same config names the key with it. Throws
// InputError "<a_origin or b_origin> is not valid TOML: ..." if a text does not parse.
struct ConfigDifference {
  std::string key, a_value, b_value;
};
std::optional<ConfigDifference> first_config_difference(const std::string& a_toml,
                                                        const std::string& b_toml,
                                                        const std::string& a_origin,
                                                        const std::string& b_origin);

}  // namespace fsdp::ckpt
