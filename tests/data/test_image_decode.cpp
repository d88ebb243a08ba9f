// Tests data/image_decode.h: PNG files of every colour type written with libpng decode to the
// pixels they were written from (grey replicated, palette looked up, alpha dropped, 16 bits
// scaled); JPEG within the codec's error; both against PIL's Image.convert("RGB") when
// /usr/bin/python3 has PIL; the resize against hand-computed values and PIL's BOX/BILINEAR; and
// bad files refused naming the file.
#include "data/image_decode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>

#include "data/image_files.h"
#include "data/temp_files.h"

namespace tessera {
namespace {

using testing::TempDir;

// A deterministic pattern of n bytes.
std::vector<uint8_t> pattern(size_t n, int mul = 37, int add = 11) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * mul + add + (i * i) % 7) & 255);
  return v;
}

// PIL's Image.open(p).convert("RGB") of each file, as raw bytes in p + ".pil"; resize: the RGB
// image resized to size x size with BOX when it shrinks both axes, else BILINEAR.
void pil_decode(const std::vector<std::string>& files, int resize = 0) {
  std::string script =
      "import sys\nfrom PIL import Image\nn = int(sys.argv[1])\nfor p in sys.argv[2:]:\n"
      "    im = Image.open(p).convert('RGB')\n"
      "    if n: im = im.resize((n, n), Image.BOX if im.width > n and im.height > n else Image.BILINEAR)\n"
      "    open(p + '.pil', 'wb').write(im.tobytes())\n";
  std::string cmd = "/usr/bin/python3 -c \"" + script + "\" " + std::to_string(resize);
  for (const auto& f : files) cmd += " '" + f + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(ImageDecode, PngColourTypesDecodeToTheirRgb) {
  TempDir dir("png_kinds");
  const int W = 5, H = 3;
  const std::vector<uint8_t> rgb = pattern(W * H * 3);
  const std::vector<uint8_t> grey = pattern(W * H, 53, 3);
  const std::vector<uint8_t> rgba = pattern(W * H * 4, 29, 5);
  const std::vector<uint8_t> ga = pattern(W * H * 2, 71, 9);
  std::vector<png_color> palette;
  for (int i = 0; i < 6; ++i) palette.push_back({uint8_t(40 * i), uint8_t(255 - 30 * i), uint8_t(17 * i * i)});
  std::vector<uint8_t> index(W * H);
  for (int i = 0; i < W * H; ++i) index[i] = uint8_t((i * 5) % 6);
  // 1-bit grey: each row's 5 pixels in the top bits of one byte (10110, 01011, 11100).
  const std::vector<uint8_t> bits = {0b10110000, 0b01011000, 0b11100000};

  testing::write_png(dir / "rgb.png", W, H, PNG_COLOR_TYPE_RGB, 8, rgb);
  testing::write_png(dir / "grey.png", W, H, PNG_COLOR_TYPE_GRAY, 8, grey);
  testing::write_png(dir / "rgba.png", W, H, PNG_COLOR_TYPE_RGBA, 8, rgba);
  testing::write_png(dir / "ga.png", W, H, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga);
  testing::write_png(dir / "palette.png", W, H, PNG_COLOR_TYPE_PALETTE, 8, index, palette);
  testing::write_png(dir / "bits.png", W, H, PNG_COLOR_TYPE_GRAY, 1, bits);

  // The oracle written out: what each pixel must be.
  std::map<std::string, std::vector<uint8_t>> want;
  for (const char* name : {"rgb", "grey", "rgba", "ga", "palette", "bits"}) want[name].resize(W * H * 3);
  for (int p = 0; p < W * H; ++p)
    for (int c = 0; c < 3; ++c) {
      want["rgb"][p * 3 + c] = rgb[p * 3 + c];
      want["grey"][p * 3 + c] = grey[p];
      want["rgba"][p * 3 + c] = rgba[p * 4 + c];  // alpha dropped
      want["ga"][p * 3 + c] = ga[p * 2];
      const png_color& pc = palette[index[p]];
      want["palette"][p * 3 + c] = c == 0 ? pc.red : c == 1 ? pc.green : pc.blue;
      const int y = p / W, x = p % W;
      want["bits"][p * 3 + c] = (bits[y] >> (7 - x)) & 1 ? 255 : 0;
    }
  for (const auto& [name, pixels] : want) {
    const RgbImage img = decode_image_file(dir / (name + ".png"));
    EXPECT_EQ(img.width, W) << name;
    EXPECT_EQ(img.height, H) << name;
    EXPECT_EQ(img.pixels, pixels) << name;
  }
  if (!testing::python_has_pil()) GTEST_SKIP() << "/usr/bin/python3 has no PIL: the PIL comparison did not run";
  std::vector<std::string> files;
  for (const auto& [name, pixels] : want) files.push_back(dir / (name + ".png"));
  pil_decode(files);
  for (const auto& f : files) EXPECT_EQ(decode_image_file(f).pixels, testing::read_image_bytes(f + ".pil")) << f;
}

TEST(ImageDecode, Png16BitIsScaledToEightBits) {
  TempDir dir("png16");
  // Big-endian 16-bit grey: 0, 257 (1), 32896 (128 exactly), 65535, 384 (1.49 -> 1), 640 (2.49 -> 2).
  const std::vector<uint16_t> v = {0, 257, 32896, 65535, 384, 640};
  std::vector<uint8_t> bytes;
  for (uint16_t x : v) {
    bytes.push_back(uint8_t(x >> 8));
    bytes.push_back(uint8_t(x & 255));
  }
  testing::write_png(dir / "g16.png", 6, 1, PNG_COLOR_TYPE_GRAY, 16, bytes);
  const RgbImage img = decode_image_file(dir / "g16.png");
  ASSERT_EQ(img.pixels.size(), 18u);
  for (size_t i = 0; i < v.size(); ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(img.pixels[i * 3 + c], std::lround(v[i] / 257.0)) << i;
}

TEST(ImageDecode, JpegDecodesWithinTheCodecsError) {
  TempDir dir("jpeg");
  // A flat colour survives JPEG almost exactly (quality 95: at most a step or two of rounding).
  const int W = 16, H = 16;
  std::vector<uint8_t> flat(W * H * 3);
  for (int p = 0; p < W * H; ++p) {
    flat[p * 3] = 200;
    flat[p * 3 + 1] = 60;
    flat[p * 3 + 2] = 120;
  }
  testing::write_jpeg(dir / "flat.jpg", W, H, 3, flat, 95);
  RgbImage img = decode_image_file(dir / "flat.jpg");
  ASSERT_EQ(img.width, W);
  ASSERT_EQ(img.height, H);
  for (size_t i = 0; i < flat.size(); ++i) EXPECT_NEAR(img.pixels[i], flat[i], 3) << i;
  // Grey JPEG: the three channels equal.
  std::vector<uint8_t> grey(W * H);
  for (int p = 0; p < W * H; ++p) grey[p] = uint8_t(8 * (p % W) + 4);
  testing::write_jpeg(dir / "grey.jpg", W, H, 1, grey, 95);
  img = decode_image_file(dir / "grey.jpg");
  for (int p = 0; p < W * H; ++p) {
    EXPECT_NEAR(img.pixels[p * 3], grey[p], 4) << p;
    EXPECT_EQ(img.pixels[p * 3], img.pixels[p * 3 + 1]);
    EXPECT_EQ(img.pixels[p * 3], img.pixels[p * 3 + 2]);
  }
  // A textured colour image against PIL's decoder (libjpeg as well, another build: 1 step allowed).
  testing::write_jpeg(dir / "pattern.jpg", 13, 9, 3, pattern(13 * 9 * 3), 80);
  if (!testing::python_has_pil()) GTEST_SKIP() << "/usr/bin/python3 has no PIL: the PIL comparison did not run";
  pil_decode({dir / "pattern.jpg", dir / "grey.jpg"});
  for (const std::string& f : {dir / "pattern.jpg", dir / "grey.jpg"}) {
    const std::vector<uint8_t> mine = decode_image_file(f).pixels, pil = testing::read_image_bytes(f + ".pil");
    ASSERT_EQ(mine.size(), pil.size()) << f;
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_NEAR(mine[i], pil[i], 1) << f << " byte " << i;
  }
}

TEST(ImageDecode, ResizeMatchesHandComputedValues) {
  // 3 x 2 -> 2 x 2: x shrinks (area: output 0 covers [0, 1.5), output 1 [1.5, 3)), y stays.
  // Row (0, 90, 180): (0 + 0.5 * 90) / 1.5 = 30 and (0.5 * 90 + 180) / 1.5 = 150.
  RgbImage a{3, 2, {}};
  for (int y = 0; y < 2; ++y)
    for (int v : {0, 90, 180})
      for (int c = 0; c < 3; ++c) a.pixels.push_back(uint8_t(v + y + c));
  std::vector<uint8_t> want;
  for (int y = 0; y < 2; ++y)
    for (int v : {30, 150})
      for (int c = 0; c < 3; ++c) want.push_back(uint8_t(v + y + c));
  EXPECT_EQ(resize_rgb(a, 2), want);
  // 2 x 1 -> 4 x 4: bilinear, centres (o + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 clamped to
  // [0, 1]: (0, 100) -> 0, 25, 75, 100 on every row (the one input row repeated).
  RgbImage b{2, 1, {0, 0, 0, 100, 100, 100}};
  want.clear();
  for (int y = 0; y < 4; ++y)
    for (int v : {0, 25, 75, 100})
      for (int c = 0; c < 3; ++c) want.push_back(uint8_t(v));
  EXPECT_EQ(resize_rgb(b, 4), want);
  // 4 x 4 -> 2 x 2: each output the mean of a 2 x 2 block (rounded: (1 + 2 + 5 + 6) / 4 = 3.5 -> 4).
  RgbImage c{4, 4, {}};
  for (int p = 0; p < 16; ++p)
    for (int ch = 0; ch < 3; ++ch) c.pixels.push_back(uint8_t(p + 1));
  const std::vector<uint8_t> r = resize_rgb(c, 2);
  EXPECT_EQ(r[0], 4);   // 1 2 5 6
  EXPECT_EQ(r[3], 6);   // 3 4 7 8 -> 5.5 -> 6
  EXPECT_EQ(r[6], 12);  // 9 10 13 14 -> 11.5 -> 12
  EXPECT_EQ(r[9], 14);  // 11 12 15 16 -> 13.5 -> 14
  // The same size is the identity.
  EXPECT_EQ(resize_rgb(c, 4), c.pixels);
}

TEST(ImageDecode, ResizeMatchesPil) {
  if (!testing::python_has_pil()) GTEST_SKIP() << "/usr/bin/python3 has no PIL: the PIL comparison did not run";
  TempDir dir("resize");
  // PIL's BOX weights each input pixel whose centre falls in the output's area fully, so it is the
  // area average only at whole ratios: 24 x 16 -> 8 x 8 (3 and 2).
  testing::write_png(dir / "big.png", 24, 16, PNG_COLOR_TYPE_RGB, 8, pattern(24 * 16 * 3, 13, 7));
  testing::write_png(dir / "small.png", 3, 4, PNG_COLOR_TYPE_RGB, 8, pattern(3 * 4 * 3, 61, 2));
  pil_decode({dir / "big.png"}, 8);    // both axes shrink by whole ratios: BOX
  pil_decode({dir / "small.png"}, 9);  // both grow: BILINEAR
  for (const auto& [f, n] : {std::pair{dir / "big.png", 8}, std::pair{dir / "small.png", 9}}) {
    const std::vector<uint8_t> mine = resize_rgb(decode_image_file(f), n), pil = testing::read_image_bytes(f + ".pil");
    ASSERT_EQ(mine.size(), pil.size()) << f;
    // PIL resamples in fixed point (weights of 2^-22, rounded): a step of 1 either way.
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_NEAR(mine[i], pil[i], 1) << f << " byte " << i;
  }
}

TEST(ImageDecode, BadFilesAreRefusedNamingTheFile) {
  TempDir dir("bad");
  testing::write_png(dir / "ok.png", 8, 8, PNG_COLOR_TYPE_RGB, 8, pattern(8 * 8 * 3));
  testing::write_jpeg(dir / "ok.jpg", 8, 8, 3, pattern(8 * 8 * 3), 90);
  std::vector<uint8_t> png = testing::read_image_bytes(dir / "ok.png"), jpg = testing::read_image_bytes(dir / "ok.jpg");
  testing::write_image_bytes(dir / "cut.png", std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2));
  testing::write_image_bytes(dir / "cut.jpg", std::vector<uint8_t>(jpg.begin(), jpg.begin() + jpg.size() / 2));
  std::vector<uint8_t> crc = png;
  crc[40] ^= 0x55;  // inside IHDR/IDAT: a CRC mismatch
  testing::write_image_bytes(dir / "crc.png", crc);
  testing::write_image_bytes(dir / "text.png", {'h', 'e', 'l', 'l', 'o', '\n'});
  testing::write_image_bytes(dir / "empty.jpg", {});
  EXPECT_TRUE(testing::throws_with([&] { decode_image_file(dir / "missing.png"); },
                                   {dir / "missing.png" + ": cannot open the image (missing or unreadable)"}));
  EXPECT_TRUE(testing::throws_with([&] { decode_image_file(dir / "cut.png"); }, {dir / "cut.png" + ": bad PNG"}));
  EXPECT_TRUE(testing::throws_with([&] { decode_image_file(dir / "cut.jpg"); }, {dir / "cut.jpg" + ": bad JPEG"}));
  EXPECT_TRUE(testing::throws_with([&] { decode_image_file(dir / "crc.png"); }, {dir / "crc.png" + ": bad PNG"}));
  EXPECT_TRUE(testing::throws_with([&] { decode_image_file(dir / "text.png"); },
                                   {dir / "text.png" + ": not a PNG or JPEG file (unknown first bytes)"}));
  EXPECT_TRUE(testing::throws_with([&] { decode_image_file(dir / "empty.jpg"); },
                                   {dir / "empty.jpg" + ": not a PNG or JPEG file (it is empty)"}));
  EXPECT_EQ(decode_image_file(dir / "ok.png").width, 8);  // the good ones still decode
  EXPECT_EQ(decode_image_file(dir / "ok.jpg").width, 8);
}

}  // namespace
}  // namespace tessera
