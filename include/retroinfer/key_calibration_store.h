// Model::key_calibration kept on disk, so that a process does not repeat the 2048-token prefill of a model an
// earlier one calibrated (docs/model-runner.md "KV cache storage").
#pragma once

#include <string>

namespace retroinfer {

class Model;
class Tokenizer;

// The directory of the store: $RETROINFER_KEY_CALIBRATION_DIR, else $XDG_CACHE_HOME/retroinfer/key-calibration,
// else ~/.cache/retroinfer/key-calibration ("" when none of them is set).
std::string default_key_calibration_dir();

struct KeyCalibrationLoad {
  bool from_disk = false;  // loaded from `file` (else computed now, or already held by the model)
  std::string file;        // the store's file of this model ("" without a directory)
  std::string warning;     // why the file was not read or written, if it could not be ("" otherwise)
};

// Gives `model` its key calibration: from <dir>/<key>.keycal when that file holds one of the model's shape, else
// computed (Model::key_calibration) and written there. key: a hash of the model file's path, size and
// modification time, model_identity(model, tokenizer) and the calibration's token count, so another file or
// another build of the calibration misses. A file that cannot be read (truncated, corrupt, another shape) is
// ignored and rewritten; a store that cannot be written only costs the next process the prefill. dir "": no
// store (computed).
KeyCalibrationLoad load_or_compute_key_calibration(const Model& model, const Tokenizer* tokenizer,
                                                    const std::string& dir);

}  // namespace retroinfer
