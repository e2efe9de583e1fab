//! Grouped bar charts as SVG, drawn with plotters: one group per algorithm, one bar per
//! provider in a fixed colour, an error bar from the min to the max over the repeats, "n/a"
//! where a figure is missing and the reason under the chart.

use plotters::prelude::*;

use super::{Figure, Metric, Report};

const WIDTH: u32 = 760;
const HEIGHT: u32 = 380;

/// Colour-blind-safe palette (Okabe-Ito), one colour per provider in report order.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xF0, 0xE4, 0x42),
    RGBColor(0x99, 0x99, 0x99),
];

/// Error bars: dark grey, so they are told apart from the black axes.
pub const WHISKER: RGBColor = RGBColor(0x33, 0x33, 0x33);

/// The colour of the provider at `index` in the report's provider order.
pub fn provider_colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// The hex form plotters writes into SVG fill attributes.
pub fn colour_hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// One chart; returns the SVG text.
pub fn bar_chart(r: &Report, m: &Metric) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        if draw(&root, r, m).is_err() {
            // Drawing into a String cannot fail short of a plotters bug; leave what was drawn.
        }
        let _ = root.present();
    }
    svg
}

fn draw(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    r: &Report,
    m: &Metric,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let groups = r.algorithms.len().max(1);
    let bars = r.providers.len().max(1);
    let mut top: f64 = 0.0;
    for a in &r.algorithms {
        for p in &r.providers {
            if let Some(Figure::Value { max, .. }) = r.figure(p, a, m.key) {
                top = top.max(*max);
            }
        }
    }
    let caption = format!("{} ({})", m.title, m.unit);
    if top <= 0.0 {
        let reason = first_reason(r, m).unwrap_or_else(|| "no data".to_owned());
        return draw_not_available(root, caption, &reason);
    }
    // Room above the tallest bar for the legend, one line per provider.
    let headroom = 1.15 + 0.075 * bars as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..groups as f64, 0f64..top * headroom)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(6)
        .light_line_style(WHITE)
        .y_desc(m.unit)
        .y_label_formatter(&|v| super::fmt_num(*v))
        .draw()?;

    let slot = 0.8 / bars as f64;
    for (j, p) in r.providers.iter().enumerate() {
        let colour = provider_colour(j);
        let mut rects = Vec::new();
        let mut whiskers = Vec::new();
        for (i, a) in r.algorithms.iter().enumerate() {
            let x0 = i as f64 + 0.1 + j as f64 * slot;
            let x1 = x0 + slot * 0.9;
            match r.figure(p, a, m.key) {
                Some(Figure::Value {
                    median,
                    min,
                    max,
                    n,
                }) => {
                    rects.push(Rectangle::new([(x0, 0.0), (x1, *median)], colour.filled()));
                    if *n > 1 {
                        whiskers.push(((x0 + x1) / 2.0, *min, *max, (x1 - x0) / 4.0));
                    }
                }
                _ => {
                    let pos = chart.backend_coord(&(x0, 0.0));
                    root.draw(&Text::new(
                        "n/a",
                        (pos.0, pos.1 - 14),
                        ("sans-serif", 11).into_font(),
                    ))?;
                }
            }
        }
        chart
            .draw_series(rects)?
            .label(p.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
        for (x, lo, hi, cap) in whiskers {
            let ink = WHISKER.stroke_width(1);
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, lo), (x, hi)],
                ink,
            )))?;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x - cap, lo), (x + cap, lo)],
                ink,
            )))?;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x - cap, hi), (x + cap, hi)],
                ink,
            )))?;
        }
    }
    for (i, a) in r.algorithms.iter().enumerate() {
        let pos = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        root.draw(&Text::new(
            a.as_str(),
            (pos.0 - (a.len() as i32 * 7) / 2, pos.1 + 8),
            ("sans-serif", 14).into_font(),
        ))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A chart with no figure to draw: its caption and why, wrapped to the width.
fn draw_not_available(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: String,
    reason: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    root.draw(&Text::new(
        caption,
        (20, 20),
        ("sans-serif", 20).into_font(),
    ))?;
    // SVG text does not wrap; break the reason into lines that fit the width.
    let mut lines: Vec<String> = vec![String::from("n/a:")];
    for word in reason.split_whitespace() {
        let last = lines.last_mut().expect("one line at least");
        if last.len() + word.len() + 1 > 88 {
            lines.push(word.to_owned());
        } else {
            last.push(' ');
            last.push_str(word);
        }
    }
    for (k, line) in lines.iter().enumerate() {
        root.draw(&Text::new(
            line.clone(),
            (20, (HEIGHT / 2) as i32 - 20 + 20 * k as i32),
            ("sans-serif", 15)
                .into_font()
                .color(&RGBColor(0x80, 0x20, 0x20)),
        ))?;
    }
    Ok(())
}

/// The first reason a figure is missing, for the note under a chart.
pub fn first_reason(r: &Report, m: &Metric) -> Option<String> {
    for a in &r.algorithms {
        for p in &r.providers {
            match r.figure(p, a, m.key) {
                Some(Figure::Missing(reason)) => return Some(reason.clone()),
                None => {
                    if let Some(f) = r
                        .failures
                        .iter()
                        .find(|f| &f.cell.provider == p && &f.cell.algorithm == a)
                    {
                        return Some(format!("{p} {a} failed: {}", f.reason));
                    }
                }
                _ => {}
            }
        }
    }
    None
}
