// fuzz/fuzz_safetensors.cc: reference::checkpoint::safetensors::SafetensorsFile::read on arbitrary bytes
// written to a scratch file (header length, JSON header, tensor data), then every entry's decoded
// values, as a reader of the file would use them.
#include "fuzz/fuzz_util.h"
#include "reference/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = (dsv41::fuzz::scratch_dir() / "fuzz.safetensors").string();
  dsv41::fuzz::write_file(path, dsv41::fuzz::view(data, size));
  dsv41::fuzz::accept([&] {
    namespace st = dsv41::reference::checkpoint::safetensors;
    const st::SafetensorsFile f = st::SafetensorsFile::read(path);
    for (const std::string& name : f.names()) {
      const st::Entry& e = f.get(name);
      if (e.numel() <= (1 << 16)) (void)e.to_f32();
    }
  });
  return 0;
}
