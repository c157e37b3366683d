//! The small copy of a photo: at most [`COPY_MAX_SIDE_PX`] on its long
//! side, as JPEG. The original is the file as taken.

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::imageops::FilterType;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

use crate::outbox::MediaBytes;
use crate::ClientError;

/// The longest side of the small copy, in pixels.
pub const COPY_MAX_SIDE_PX: u32 = 1024;

/// JPEG quality of the small copy (1 to 100).
pub const COPY_JPEG_QUALITY: u8 = 85;

/// The media type of a photo's bytes, guessed from their first bytes
/// (`application/octet-stream` when unknown).
pub fn content_type_of(bytes: &[u8]) -> String {
    match image::guess_format(bytes) {
        Ok(format) => format.to_mime_type().to_owned(),
        Err(_) => "application/octet-stream".to_owned(),
    }
}

/// Makes the small copy of a photo: decoded, turned upright per its EXIF
/// orientation, scaled down (never up) to at most [`COPY_MAX_SIDE_PX`] on
/// the long side keeping the aspect ratio, and encoded as JPEG.
pub fn make_copy(photo: &[u8]) -> Result<MediaBytes, ClientError> {
    let bad = |e: image::ImageError| ClientError::Image(e.to_string());
    let mut decoder = ImageReader::new(Cursor::new(photo))
        .with_guessed_format()
        .map_err(|e| ClientError::Image(e.to_string()))?
        .into_decoder()
        .map_err(bad)?;
    let orientation = decoder.orientation().map_err(bad)?;
    let mut image = DynamicImage::from_decoder(decoder).map_err(bad)?;
    image.apply_orientation(orientation);
    if image.width().max(image.height()) > COPY_MAX_SIDE_PX {
        image = image.resize(COPY_MAX_SIDE_PX, COPY_MAX_SIDE_PX, FilterType::Triangle);
    }
    // JPEG has no alpha: grey stays grey, everything else becomes RGB.
    let image = match image {
        DynamicImage::ImageLuma8(_) => image,
        DynamicImage::ImageLumaA8(_) | DynamicImage::ImageLuma16(_) => {
            DynamicImage::ImageLuma8(image.to_luma8())
        }
        _ => DynamicImage::ImageRgb8(image.to_rgb8()),
    };
    let mut bytes = Vec::new();
    image
        .write_with_encoder(JpegEncoder::new_with_quality(&mut bytes, COPY_JPEG_QUALITY))
        .map_err(bad)?;
    Ok(MediaBytes {
        bytes,
        content_type: ImageFormat::Jpeg.to_mime_type().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageBuffer, Rgba};

    fn png(width: u32, height: u32) -> Vec<u8> {
        let buffer = ImageBuffer::from_fn(width, height, |x, y| {
            Rgba([(x % 256) as u8, (y % 256) as u8, 128, 200])
        });
        let mut out = Vec::new();
        DynamicImage::ImageRgba8(buffer)
            .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
            .unwrap();
        out
    }

    #[test]
    fn a_large_photo_becomes_a_1024_px_jpeg() {
        let photo = png(3000, 1500);
        assert_eq!(content_type_of(&photo), "image/png");
        let copy = make_copy(&photo).unwrap();
        assert_eq!(copy.content_type, "image/jpeg");
        assert_eq!(content_type_of(&copy.bytes), "image/jpeg");
        let decoded = image::load_from_memory(&copy.bytes).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (1024, 512));
    }

    #[test]
    fn a_small_photo_keeps_its_size() {
        let copy = make_copy(&png(640, 260)).unwrap();
        let decoded = image::load_from_memory(&copy.bytes).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (640, 260));
    }

    #[test]
    fn what_is_not_an_image_is_an_error() {
        assert!(matches!(
            make_copy(b"not a photo"),
            Err(ClientError::Image(_))
        ));
        assert_eq!(content_type_of(b"nope"), "application/octet-stream");
    }
}
