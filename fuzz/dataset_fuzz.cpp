// libFuzzer target: any bytes as a dataset file, read as alpaca and as sharegpt, JSON lines
// and JSON array. Records become conversations or the load throws UserError naming file:line;
// with bad_records skip, malformed records are listed instead and the rest still load.
#include "fuzz_input_file.h"
#include "hyperparallel/data/sft_dataset.h"
#include "hyperparallel/platform/user_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hyperparallel::data;
  for (const char* suffix : {".jsonl", ".json"}) {
    const std::string path = hyperparallel::fuzz::write_input(data, size, suffix);
    for (const auto format : {DatasetFormat::kAlpaca, DatasetFormat::kSharegpt}) {
      for (const auto policy : {BadRecordPolicy::kStop, BadRecordPolicy::kSkip}) {
        SftLoadOptions options;
        options.on_bad_record = policy;
        SftLoadReport report;
        try {
          load_sft_file(path, format, options, &report);
        } catch (const hyperparallel::UserError&) {
        }
      }
    }
  }
  return 0;
}
