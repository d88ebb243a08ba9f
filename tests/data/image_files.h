// Test helpers that write small PNG and JPEG files with libpng and libjpeg's encoders (the decoder
// under test is data/image_decode.h), and run /usr/bin/python3 with PIL as an independent oracle
// when it is there.
#pragma once

#include <jpeglib.h>
#include <png.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/check.h"

namespace tessera::testing {

// Writes a non-interlaced PNG. color_type: PNG_COLOR_TYPE_GRAY (1 byte a pixel at bit_depth 8, 2
// big-endian at 16), _RGB, _RGBA, _GRAY_ALPHA, or _PALETTE (one index a pixel, palette given).
inline void write_png(const std::string& path, int width, int height, int color_type, int bit_depth,
                      const std::vector<uint8_t>& data, const std::vector<png_color>& palette = {}) {
  FILE* f = std::fopen(path.c_str(), "wb");
  TESSERA_CHECK(f, "cannot write ", path);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    detail::fail("libpng failed writing ", path);
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, width, height, bit_depth, color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (color_type == PNG_COLOR_TYPE_PALETTE)
    png_set_PLTE(png, info, const_cast<png_colorp>(palette.data()), static_cast<int>(palette.size()));
  png_write_info(png, info);
  const size_t row = png_get_rowbytes(png, info);
  for (int y = 0; y < height; ++y) png_write_row(png, const_cast<png_bytep>(data.data() + y * row));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

// Writes a baseline JPEG of `components` (1 grey, 3 RGB) bytes a pixel at the given quality.
inline void write_jpeg(const std::string& path, int width, int height, int components, const std::vector<uint8_t>& data,
                       int quality) {
  FILE* f = std::fopen(path.c_str(), "wb");
  TESSERA_CHECK(f, "cannot write ", path);
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = width;
  c.image_height = height;
  c.input_components = components;
  c.in_color_space = components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW r = const_cast<JSAMPROW>(data.data() + size_t(c.next_scanline) * width * components);
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::fclose(f);
}

// Whether /usr/bin/python3 can import PIL (the oracle); tests skip, saying so, when it cannot.
inline bool python_has_pil() {
  return std::filesystem::exists("/usr/bin/python3") &&
         std::system("/usr/bin/python3 -c 'import PIL' > /dev/null 2>&1") == 0;
}

inline std::vector<uint8_t> read_image_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_image_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

}  // namespace tessera::testing
