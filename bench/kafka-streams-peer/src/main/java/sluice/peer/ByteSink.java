package sluice.peer;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/** A growable byte buffer with the few writes the store codec and the checksum need. */
final class ByteSink {
    private static final byte[] HEX = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);

    byte[] buf;
    int len;

    ByteSink(int capacity) {
        buf = new byte[Math.max(16, capacity)];
    }

    void reset() {
        len = 0;
    }

    byte[] toArray() {
        return Arrays.copyOf(buf, len);
    }

    private void ensure(int extra) {
        if (len + extra > buf.length) {
            buf = Arrays.copyOf(buf, Math.max(buf.length * 2, len + extra));
        }
    }

    void put(byte b) {
        ensure(1);
        buf[len++] = b;
    }

    void put(byte[] b) {
        put(b, 0, b.length);
    }

    void put(byte[] b, int off, int n) {
        ensure(n);
        System.arraycopy(b, off, buf, len, n);
        len += n;
    }

    /** Big-endian int. */
    void putInt(int v) {
        ensure(4);
        buf[len] = (byte) (v >>> 24);
        buf[len + 1] = (byte) (v >>> 16);
        buf[len + 2] = (byte) (v >>> 8);
        buf[len + 3] = (byte) v;
        len += 4;
    }

    /** Big-endian long. */
    void putLong(long v) {
        putInt((int) (v >>> 32));
        putInt((int) v);
    }

    /** Length-prefixed bytes; -1 for null. */
    void putBlob(byte[] b) {
        if (b == null) {
            putInt(-1);
        } else {
            putInt(b.length);
            put(b);
        }
    }

    /** UTF-8 bytes of s (no length prefix). */
    void putUtf8(String s) {
        put(s.getBytes(StandardCharsets.UTF_8));
    }

    /** ASCII text (digits, fixed tokens). */
    void putAscii(String s) {
        int n = s.length();
        ensure(n);
        for (int i = 0; i < n; i++) {
            buf[len++] = (byte) s.charAt(i);
        }
    }

    /** Lowercase hex of b. */
    void putHex(byte[] b) {
        ensure(b.length * 2);
        for (byte x : b) {
            buf[len++] = HEX[(x >> 4) & 0xf];
            buf[len++] = HEX[x & 0xf];
        }
    }

    /** Exactly 16 lowercase hex digits of v. */
    void putHex16(long v) {
        ensure(16);
        for (int shift = 60; shift >= 0; shift -= 4) {
            buf[len++] = HEX[(int) (v >>> shift) & 0xf];
        }
    }
}
