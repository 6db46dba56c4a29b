package driver

import (
	"strings"
	"testing"
)

func TestRichClamp(t *testing.T) {
	png := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 100)...)
	caps := RichCaps{DisplayBytes: 10, MaxImages: 1, ImageBytes: 200, MaxFiles: 2, EmbedBytes: 4, EmbedTotalBytes: 6}
	cases := []struct {
		name  string
		in    *Rich
		check func(*Rich) bool
	}{
		{"nil stays nil", nil, func(r *Rich) bool { return r == nil }},
		{"empty becomes nil", &Rich{}, func(r *Rich) bool { return r == nil }},
		{"display cut on a rune boundary", &Rich{Display: "ééééééé"}, func(r *Rich) bool {
			return strings.HasPrefix(r.Display, "ééééé\n[airlock: display truncated")
		}},
		{"only PNGs, within count and size", &Rich{Images: [][]byte{[]byte("GIF89a"), png, png, append(png, make([]byte, 200)...)}}, func(r *Rich) bool {
			return len(r.Images) == 1 && r.ImagesSkipped == 3
		}},
		{"files stay under out/, embed budget holds", &Rich{Files: []OutFile{
			{Path: "../x", Size: 1}, {Path: "/etc/passwd", Size: 1}, {Path: "top.txt", Size: 1},
			{Path: "out/a", Size: 4, Content: []byte("abcd")}, {Path: "out/b", Size: 4, Content: []byte("efgh")}, {Path: "out/c", Size: 1},
		}}, func(r *Rich) bool {
			return len(r.Files) == 2 && r.Files[0].Path == "out/a" && string(r.Files[0].Content) == "abcd" &&
				r.Files[1].Path == "out/b" && r.Files[1].Content == nil && r.FilesTruncated
		}},
		{"content must match its size", &Rich{Files: []OutFile{{Path: "out/a", Size: 1, Content: []byte("abc")}}}, func(r *Rich) bool {
			return len(r.Files) == 1 && r.Files[0].Content == nil
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.in.Clamp(caps); !c.check(got) {
				t.Errorf("Clamp = %+v", got)
			}
		})
	}
}
