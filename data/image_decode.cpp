// PNG and JPEG decoding (libpng, libjpeg) and the square resize. libpng and libjpeg report errors
// by longjmp: each decoder runs the library calls in one function that does the setjmp, holds no
// C++ object with a destructor between setjmp and the library calls (the handles are owned by
// RAII guards in the caller), and turns a longjmp into a returned message, thrown by the caller as
// an Error naming the file.
#include "data/image_decode.h"

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "kernels/check.h"

namespace tessera {

namespace {

// ---- PNG ----

struct PngSource {
  const uint8_t* data;
  size_t size, pos;
};

struct PngError {
  char message[256];
};

void png_read_memory(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->size - src->pos < n) png_error(png, "the file is truncated");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

void png_on_error(png_structp png, png_const_charp msg) {
  auto* err = static_cast<PngError*>(png_get_error_ptr(png));
  std::snprintf(err->message, sizeof err->message, "%s", msg);
  png_longjmp(png, 1);
}
void png_on_warning(png_structp, png_const_charp) {}  // benign (e.g. an unknown chunk's CRC policy)

// Owns the read and info structs.
struct PngHandles {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngHandles() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

// The setjmp frame: only plain data lives here. On success rows are written into out (resized by
// the caller through `allocate` before any row is read). Returns false with err filled on failure.
bool png_decode_raw(PngHandles& h, PngSource& src, PngError& err, RgbImage& out,
                    void (*allocate)(RgbImage&, png_uint_32, png_uint_32), std::vector<png_bytep>& rows) {
  if (setjmp(png_jmpbuf(h.png))) return false;
  png_set_read_fn(h.png, &src, png_read_memory);
  png_set_user_limits(h.png, kMaxImageSide, kMaxImageSide);
  png_read_info(h.png, h.info);
  const png_byte color = png_get_color_type(h.png, h.info);
  png_set_expand(h.png);      // palette -> RGB, grey < 8 bits -> 8, tRNS -> alpha
  png_set_scale_16(h.png);    // 16 -> 8 bits, rounded
  png_set_strip_alpha(h.png);  // alpha dropped, as PIL's convert("RGB")
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(h.png);
  png_set_interlace_handling(h.png);
  png_read_update_info(h.png, h.info);
  const png_uint_32 w = png_get_image_width(h.png, h.info), ht = png_get_image_height(h.png, h.info);
  if (png_get_rowbytes(h.png, h.info) != size_t(w) * 3) png_error(h.png, "unexpected row size after conversion");
  allocate(out, w, ht);
  rows.resize(ht);
  for (png_uint_32 y = 0; y < ht; ++y) rows[y] = out.pixels.data() + size_t(y) * w * 3;
  png_read_image(h.png, rows.data());
  png_read_end(h.png, nullptr);
  return true;
}

void allocate_rgb(RgbImage& img, png_uint_32 w, png_uint_32 h) {
  img.width = w;
  img.height = h;
  img.pixels.assign(size_t(w) * h * 3, 0);
}

RgbImage decode_png(const uint8_t* data, size_t size, const std::string& name) {
  PngError err{};
  PngHandles h;
  h.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, png_on_error, png_on_warning);
  TESSERA_CHECK(h.png, name, ": cannot start libpng");
  h.info = png_create_info_struct(h.png);
  TESSERA_CHECK(h.info, name, ": cannot start libpng");
  PngSource src{data, size, 0};
  RgbImage img;
  std::vector<png_bytep> rows;
  if (!png_decode_raw(h, src, err, img, allocate_rgb, rows)) detail::fail(name, ": bad PNG: ", err.message);
  return img;
}

// ---- JPEG ----

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// libjpeg only warns about corrupt data (a truncated file decodes with grey rows): an error here.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_on_error(cinfo);
}

struct JpegHandle {
  jpeg_decompress_struct cinfo;
  bool created = false;
  ~JpegHandle() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

bool jpeg_decode_raw(JpegHandle& h, JpegError& err, const uint8_t* data, size_t size, RgbImage& out) {
  if (setjmp(err.jump)) return false;
  jpeg_create_decompress(&h.cinfo);
  h.created = true;
  jpeg_mem_src(&h.cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&h.cinfo, TRUE);
  if (h.cinfo.jpeg_color_space == JCS_CMYK || h.cinfo.jpeg_color_space == JCS_YCCK) {
    std::snprintf(err.message, sizeof err.message, "CMYK JPEG is not supported; convert it to RGB");
    return false;
  }
  if (h.cinfo.image_width > kMaxImageSide || h.cinfo.image_height > kMaxImageSide) {
    std::snprintf(err.message, sizeof err.message, "%ux%u pixels is larger than %lld a side", h.cinfo.image_width,
                  h.cinfo.image_height, static_cast<long long>(kMaxImageSide));
    return false;
  }
  h.cinfo.out_color_space = JCS_RGB;  // grey and YCbCr alike
  jpeg_start_decompress(&h.cinfo);
  allocate_rgb(out, h.cinfo.output_width, h.cinfo.output_height);
  while (h.cinfo.output_scanline < h.cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + size_t(h.cinfo.output_scanline) * h.cinfo.output_width * 3;
    jpeg_read_scanlines(&h.cinfo, &row, 1);
  }
  jpeg_finish_decompress(&h.cinfo);
  return true;
}

RgbImage decode_jpeg(const uint8_t* data, size_t size, const std::string& name) {
  JpegError err{};
  JpegHandle h;
  h.cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.emit_message = jpeg_on_message;
  RgbImage img;
  if (!jpeg_decode_raw(h, err, data, size, img)) detail::fail(name, ": bad JPEG: ", err.message);
  return img;
}

// ---- resize ----

// For each output index along an axis, the input indices and weights that make it (summing to 1).
struct AxisTap {
  int64_t index;
  double weight;
};

std::vector<std::vector<AxisTap>> axis_taps(int64_t in, int64_t out) {
  std::vector<std::vector<AxisTap>> taps(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    auto& t = taps[static_cast<size_t>(o)];
    if (out < in) {  // area average over [o scale, (o + 1) scale)
      const double a = o * scale, b = (o + 1) * scale;
      for (int64_t i = static_cast<int64_t>(std::floor(a)); i < std::min<int64_t>(in, static_cast<int64_t>(std::ceil(b))); ++i) {
        const double cover = std::min<double>(b, i + 1) - std::max<double>(a, i);
        if (cover > 0) t.push_back({i, cover / scale});
      }
    } else {  // bilinear, centres at +0.5, edges repeated
      const double x = std::clamp((o + 0.5) * scale - 0.5, 0.0, static_cast<double>(in - 1));
      const int64_t i0 = static_cast<int64_t>(std::floor(x)), i1 = std::min(i0 + 1, in - 1);
      const double w = x - static_cast<double>(i0);
      t.push_back({i0, 1 - w});
      if (w > 0) t.push_back({i1, w});
    }
  }
  return taps;
}

}  // namespace

RgbImage decode_image(const uint8_t* data, size_t size, const std::string& name) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return decode_png(data, size, name);
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return decode_jpeg(data, size, name);
  detail::fail(name, ": not a PNG or JPEG file (", size == 0 ? "it is empty" : "unknown first bytes", ")");
}

RgbImage decode_image_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in, path, ": cannot open the image (missing or unreadable)");
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TESSERA_CHECK(!in.bad(), path, ": cannot read the image");
  return decode_image(bytes.data(), bytes.size(), path);
}

std::vector<uint8_t> resize_rgb(const RgbImage& img, int64_t size) {
  TESSERA_CHECK(size > 0, "resize: the size must be positive, got ", size);
  TESSERA_CHECK(img.width > 0 && img.height > 0, "resize: the image is empty");
  if (img.width == size && img.height == size) return img.pixels;
  const auto tx = axis_taps(img.width, size), ty = axis_taps(img.height, size);
  // Rows first: (H, size, 3), then columns: (size, size, 3).
  std::vector<double> mid(static_cast<size_t>(img.height * size * 3), 0.0);
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < size; ++x)
      for (const AxisTap& t : tx[static_cast<size_t>(x)])
        for (int c = 0; c < 3; ++c)
          mid[static_cast<size_t>((y * size + x) * 3 + c)] +=
              t.weight * img.pixels[static_cast<size_t>((y * img.width + t.index) * 3 + c)];
  std::vector<uint8_t> out(static_cast<size_t>(size * size * 3));
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x)
      for (int c = 0; c < 3; ++c) {
        double v = 0;
        for (const AxisTap& t : ty[static_cast<size_t>(y)]) v += t.weight * mid[static_cast<size_t>((t.index * size + x) * 3 + c)];
        out[static_cast<size_t>((y * size + x) * 3 + c)] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
  return out;
}

}  // namespace tessera
