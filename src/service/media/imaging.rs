//! Image work for the media repository: decoding with hard limits, thumbnails at the spec's
//! standard sizes, and BlurHash placeholders. Pure functions: callers run them on a blocking
//! thread.

use std::io::Cursor;

use image::{imageops::FilterType, DynamicImage, ImageFormat, ImageReader, Limits};

/// Largest width or height decoded; bigger images (or decompression bombs claiming to be)
/// are refused before any pixel memory is allocated. The pixel count is capped as well
/// (`MYELIN_MAX_IMAGE_PIXELS`), which is what bounds memory.
const MAX_DIMENSION: u32 = 12_000;
/// Most memory a decode may allocate.
const MAX_DECODE_ALLOC: u64 = 512 * 1024 * 1024;

/// How a thumbnail fits the requested box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Fill the box exactly, cropping what sticks out.
    Crop,
    /// Fit inside the box, keeping the aspect ratio.
    Scale,
}

impl Method {
    /// The query-string name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Crop => "crop",
            Method::Scale => "scale",
        }
    }
}

/// The sizes thumbnails are made at (as the spec suggests and Synapse does).
pub const STANDARD_SIZES: [(u32, u32, Method); 5] = [
    (32, 32, Method::Crop),
    (96, 96, Method::Crop),
    (320, 240, Method::Scale),
    (640, 480, Method::Scale),
    (800, 600, Method::Scale),
];

/// A generated thumbnail.
pub struct Thumbnail {
    /// Encoded bytes.
    pub bytes: Vec<u8>,
    /// Their content type.
    pub content_type: &'static str,
    /// Pixel width.
    pub width: u32,
    /// Pixel height.
    pub height: u32,
}

/// The standard size serving a request: the smallest of the same method at least as big as
/// asked, else the largest of that method.
pub fn standard_size(width: u32, height: u32, method: Method) -> (u32, u32, Method) {
    let same: Vec<_> = STANDARD_SIZES
        .iter()
        .filter(|(_, _, m)| *m == method)
        .collect();
    same.iter()
        .find(|(w, h, _)| *w >= width && *h >= height)
        .or(same.last())
        .map(|&&size| size)
        .expect("every method has standard sizes")
}

/// Decodes an image of at most `max_pixels` (width times height), refusing anything larger
/// from its header, before any pixel memory is allocated.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<DynamicImage, String> {
    let reader = || {
        ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| e.to_string())
    };
    let (width, height) = reader()?.into_dimensions().map_err(|e| e.to_string())?;
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(format!("{width}x{height} is more than {max_pixels} pixels"));
    }
    let mut reader = reader()?;
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_DIMENSION);
    limits.max_image_height = Some(MAX_DIMENSION);
    limits.max_alloc = Some(MAX_DECODE_ALLOC);
    reader.limits(limits);
    reader.decode().map_err(|e| e.to_string())
}

/// A thumbnail of `image` for a box, never upscaled: a crop keeps the box's aspect ratio, a
/// scale keeps the image's. JPEG sources give JPEG thumbnails, everything else PNG (which
/// keeps transparency).
pub fn thumbnail(
    image: &DynamicImage,
    source_type: &str,
    width: u32,
    height: u32,
    method: Method,
) -> Result<Thumbnail, String> {
    let (w, h) = (image.width(), image.height());
    let resized = match method {
        Method::Scale if w <= width && h <= height => image.clone(),
        Method::Scale => image.resize(width, height, FilterType::Triangle),
        Method::Crop if w >= width && h >= height => {
            image.resize_to_fill(width, height, FilterType::Triangle)
        }
        Method::Crop => {
            // Too small to fill the box: crop to its aspect ratio at the original scale.
            let scale = (w as f64 / width as f64).min(h as f64 / height as f64);
            let (cw, ch) = (
                ((width as f64 * scale).round() as u32).clamp(1, w),
                ((height as f64 * scale).round() as u32).clamp(1, h),
            );
            image.crop_imm((w - cw) / 2, (h - ch) / 2, cw, ch)
        }
    };
    let (format, content_type) = if source_type == "image/jpeg" {
        (ImageFormat::Jpeg, "image/jpeg")
    } else {
        (ImageFormat::Png, "image/png")
    };
    let encodable = match format {
        ImageFormat::Jpeg => DynamicImage::ImageRgb8(resized.to_rgb8()),
        _ => resized,
    };
    let mut bytes = Vec::new();
    encodable
        .write_to(&mut Cursor::new(&mut bytes), format)
        .map_err(|e| e.to_string())?;
    Ok(Thumbnail {
        bytes,
        content_type,
        width: encodable.width(),
        height: encodable.height(),
    })
}

/// A BlurHash of the image (MSC2448), computed on a small copy.
pub fn blurhash(image: &DynamicImage) -> Option<String> {
    let small = image.thumbnail(64, 64).to_rgba8();
    let (w, h) = small.dimensions();
    let (x, y) = if w >= h { (4, 3) } else { (3, 4) };
    blurhash::encode(x, y, w, h, small.as_raw()).ok()
}

/// Whether a content type is an image this module can decode.
pub fn is_decodable(content_type: &str) -> bool {
    matches!(
        content_type,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_onto_standard_sizes() {
        assert_eq!(standard_size(10, 10, Method::Crop), (32, 32, Method::Crop));
        assert_eq!(standard_size(50, 50, Method::Crop), (96, 96, Method::Crop));
        assert_eq!(
            standard_size(500, 400, Method::Scale),
            (640, 480, Method::Scale)
        );
        assert_eq!(
            standard_size(4000, 4000, Method::Scale),
            (800, 600, Method::Scale)
        );
    }

    #[test]
    fn thumbnails_fit_and_never_upscale() {
        let image = DynamicImage::new_rgb8(1000, 500);
        let scaled = thumbnail(&image, "image/png", 320, 240, Method::Scale).unwrap();
        assert_eq!((scaled.width, scaled.height), (320, 160));
        let cropped = thumbnail(&image, "image/jpeg", 96, 96, Method::Crop).unwrap();
        assert_eq!((cropped.width, cropped.height), (96, 96));
        let tiny = DynamicImage::new_rgb8(20, 10);
        let kept = thumbnail(&tiny, "image/png", 320, 240, Method::Scale).unwrap();
        assert_eq!((kept.width, kept.height), (20, 10));
        let square = thumbnail(&tiny, "image/png", 32, 32, Method::Crop).unwrap();
        assert_eq!((square.width, square.height), (10, 10));
    }
}
