package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// modeColors give each mode the same colour in every chart.
var modeColors = map[string]color.RGBA{
	ModeNative:  {0x4d, 0x4d, 0x4d, 0xff},
	ModeRunc:    {0x99, 0x99, 0x99, 0xff},
	ModeCold:    {0x1f, 0x77, 0xb4, 0xff},
	ModeWarm:    {0x2c, 0xa0, 0x2c, 0xff},
	ModeMCPCold: {0x9e, 0xc9, 0xe2, 0xff},
	ModeMCPWarm: {0x98, 0xdf, 0x8a, 0xff},
	// The Kubernetes modes, in purples.
	ModeK8sCold:    {0x75, 0x6b, 0xb1, 0xff},
	ModeK8sWarm:    {0x9e, 0x9a, 0xc8, 0xff},
	ModeMCPK8sCold: {0x54, 0x27, 0x8f, 0xff},
	ModeMCPK8sWarm: {0xbc, 0xbd, 0xdc, 0xff},
	// The safety variants, in oranges (cold darker).
	ModeColdNoMonitor: {0xe6, 0x55, 0x0d, 0xff},
	ModeWarmNoMonitor: {0xfd, 0x8d, 0x3c, 0xff},
	ModeColdDirectFS:  {0xa6, 0x36, 0x03, 0xff},
	ModeWarmDirectFS:  {0xfd, 0xae, 0x6b, 0xff},
}

// Chart draws p50 latency by mode, one group of bars per program, at the
// lowest concurrency measured, on a log scale, and writes it as a PNG.
func (r *Report) Chart(path string) error {
	c := 0
	for _, x := range r.Results {
		if c == 0 || x.Concurrency < c {
			c = x.Concurrency
		}
	}
	var progs, modes []string
	seen := map[string]bool{}
	for _, x := range r.Results {
		if !seen["p"+x.Program] {
			seen["p"+x.Program] = true
			progs = append(progs, x.Program)
		}
		if !seen["m"+x.Mode] {
			seen["m"+x.Mode] = true
			modes = append(modes, x.Mode)
		}
	}
	const w, h, left, right, top, bottom = 1100, 520, 70, 190, 50, 60
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text := func(x, y int, s string, col color.Color) {
		d := &font.Drawer{Dst: img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	fill := func(x0, y0, x1, y1 int, col color.Color) {
		draw.Draw(img, image.Rect(x0, y0, x1, y1), image.NewUniform(col), image.Point{}, draw.Src)
	}
	grey := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	text(left, 25, fmt.Sprintf("airlock: p50 latency by mode (ms, log scale), concurrency %d, %s", c, r.Started.Format("2006-01-02")), color.Black)
	// Log axis from 1 ms to 10 s.
	lo, hi := 0.0, 4.0
	plotH := h - top - bottom
	y := func(ms float64) int {
		v := math.Log10(math.Max(ms, 1))
		return h - bottom - int((v-lo)/(hi-lo)*float64(plotH))
	}
	for e := 0; e <= 4; e++ {
		yy := y(math.Pow(10, float64(e)))
		fill(left, yy, w-right, yy+1, grey)
		text(10, yy+4, fmt.Sprintf("%6.0f", math.Pow(10, float64(e))), color.Black)
	}
	groupW := (w - left - right) / max(len(progs), 1)
	barW := max((groupW-20)/max(len(modes), 1), 4)
	for gi, p := range progs {
		x0 := left + gi*groupW + 10
		for mi, m := range modes {
			x := r.find(m, p, c)
			if x == nil {
				continue
			}
			bx := x0 + mi*barW
			fill(bx, y(x.P50), bx+barW-2, h-bottom, modeColors[m])
		}
		text(x0, h-bottom+18, p, color.Black)
	}
	for mi, m := range modes {
		yy := top + 20*mi
		fill(w-right+15, yy, w-right+30, yy+12, modeColors[m])
		text(w-right+36, yy+11, m, color.Black)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
