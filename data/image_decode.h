// Image files for `tessera prepare --images` and `tessera generate --image`: PNG (libpng) and JPEG
// (libjpeg) decoded to 8-bit RGB, and a resize to the model's square size. Key decisions: the file
// type comes from its first bytes, not its name; grey, palette, 16-bit and alpha are converted as
// PIL's Image.convert("RGB") does (grey replicated, palette looked up, 16-bit scaled to 8, alpha
// dropped); every libpng/libjpeg failure (truncated, corrupt, not an image) is a tessera::Error
// naming the file, never a crash or a partly grey image.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // (height, width, 3) row-major
};

// Images larger than this many pixels a side are refused (a guard against corrupt headers).
constexpr int64_t kMaxImageSide = 16384;

// Decodes a PNG or JPEG held in memory; `name` (a file name) starts every error message.
RgbImage decode_image(const uint8_t* data, size_t size, const std::string& name);
// Reads and decodes a file; an Error names the file when it is missing, unreadable or bad.
RgbImage decode_image_file(const std::string& path);

// Resizes to (size, size, 3), each axis on its own (the aspect ratio is not kept): an axis that
// shrinks is area-averaged (each output pixel the mean of the input area it covers, fractional
// pixels weighted by their coverage, as OpenCV's INTER_AREA; PIL's Image.BOX at whole ratios, where
// PIL weighs a partly covered pixel fully), an axis that grows or stays is bilinear with
// pixel centres at +0.5 and the edge pixels repeated (PIL's Image.BILINEAR when upscaling); values
// rounded to the nearest integer. The same size returns the pixels unchanged.
std::vector<uint8_t> resize_rgb(const RgbImage& img, int64_t size);

}  // namespace tessera
