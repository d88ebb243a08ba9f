// Fuzzes the image decoders (data/image_decode.h: libpng and libjpeg behind tessera's error
// handling) and the resize. No files: decode_image takes bytes. An image that decodes has
// width x height x 3 bytes within the size limit, and resizes to 5 x 5.
#include "data/image_decode.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tf::expect_clean("decode_image", [&] {
    const tessera::RgbImage img = tessera::decode_image(data, size, "fuzz.img");
    if (img.width <= 0 || img.height <= 0 || img.width > tessera::kMaxImageSide || img.height > tessera::kMaxImageSide ||
        img.pixels.size() != static_cast<size_t>(img.width * img.height * 3))
      tf::finding("decoded image of " + std::to_string(img.width) + "x" + std::to_string(img.height) + " holds " +
                  std::to_string(img.pixels.size()) + " bytes");
    if (tessera::resize_rgb(img, 5).size() != 75) tf::finding("resize to 5x5 is not 75 bytes");
  });
  return 0;
}
