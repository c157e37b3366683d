// The small copy the brain reads: the photo resized in a canvas so that
// its longer side is at most 1024 px, as JPEG (SPEC section 1; the seed's
// "small copy").

/** The longest side of the copy, in px. */
export const COPY_MAX_PX = 1024;
/** The copy's JPEG quality (0..1). */
export const COPY_JPEG_QUALITY = 0.85;

/** The size that fits `width` x `height` into `max` px on the longer side, never enlarged. */
export function fitWithin(width: number, height: number, max: number = COPY_MAX_PX): { width: number; height: number } {
  const scale = Math.min(1, max / Math.max(width, height));
  return { width: Math.max(1, Math.round(width * scale)), height: Math.max(1, Math.round(height * scale)) };
}

/** Makes the copy of `photo` in a canvas (OffscreenCanvas where there is one, else a `<canvas>`): at most 1024 px, JPEG. */
export async function makeCopy(photo: Blob): Promise<Blob> {
  const bitmap = await createImageBitmap(photo, { imageOrientation: "from-image" });
  const { width, height } = fitWithin(bitmap.width, bitmap.height);
  try {
    if (typeof OffscreenCanvas !== "undefined") {
      const canvas = new OffscreenCanvas(width, height);
      const context = canvas.getContext("2d");
      if (!context) throw new Error("no 2d canvas context");
      context.drawImage(bitmap, 0, 0, width, height);
      return await canvas.convertToBlob({ type: "image/jpeg", quality: COPY_JPEG_QUALITY });
    }
    const canvas = document.createElement("canvas");
    canvas.width = width;
    canvas.height = height;
    const context = canvas.getContext("2d");
    if (!context) throw new Error("no 2d canvas context");
    context.drawImage(bitmap, 0, 0, width, height);
    return await new Promise<Blob>((resolve, reject) =>
      canvas.toBlob((b) => (b ? resolve(b) : reject(new Error("the canvas gave no JPEG"))), "image/jpeg", COPY_JPEG_QUALITY),
    );
  } finally {
    bitmap.close();
  }
}
